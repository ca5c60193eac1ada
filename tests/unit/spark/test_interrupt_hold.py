"""Ctrl-C while a session starts is held and raised once it is up (see
`cdcflow.spark.session._HeldInterrupts`)."""

from __future__ import annotations

import os
import signal

import pytest

from cdcflow.spark.session import _HeldInterrupts

pytestmark = pytest.mark.unit


def test_an_interrupt_inside_is_raised_after_the_block_and_the_handler_restored():
    before = signal.getsignal(signal.SIGINT)
    finished = False
    with pytest.raises(KeyboardInterrupt), _HeldInterrupts():
        os.kill(os.getpid(), signal.SIGINT)
        finished = True  # the interrupt did not cut the block short
    assert finished
    assert signal.getsignal(signal.SIGINT) is before


def test_no_interrupt_means_no_exception():
    before = signal.getsignal(signal.SIGINT)
    with _HeldInterrupts():
        pass
    assert signal.getsignal(signal.SIGINT) is before


def test_a_handler_set_inside_is_held_off_then_kept():
    """SparkContext installs its own SIGINT handler while it starts: an interrupt after that
    is still held, and Spark's handler is the one in place afterwards."""
    called: list[int] = []

    def sparks_own(signum: int, _frame: object) -> None:
        called.append(signum)

    before = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(KeyboardInterrupt), _HeldInterrupts() as interrupts:
            signal.signal(signal.SIGINT, sparks_own)
            interrupts.keep()
            os.kill(os.getpid(), signal.SIGINT)
        assert called == []
        assert signal.getsignal(signal.SIGINT) is sparks_own
    finally:
        signal.signal(signal.SIGINT, before)


def test_an_error_inside_is_not_replaced_by_the_held_interrupt():
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(RuntimeError), _HeldInterrupts():
        os.kill(os.getpid(), signal.SIGINT)
        raise RuntimeError("the JVM did not start")
    assert signal.getsignal(signal.SIGINT) is before
