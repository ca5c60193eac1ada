"""Ctrl-C while the JVM starts is held and raised once the block is done (see
`cdcflow.spark.session._interrupt_once_connected`)."""

from __future__ import annotations

import os
import signal

import pytest

from cdcflow.spark.session import _interrupt_once_connected

pytestmark = pytest.mark.unit


def test_an_interrupt_inside_is_raised_after_the_block_and_the_handler_restored():
    before = signal.getsignal(signal.SIGINT)
    finished = False
    with pytest.raises(KeyboardInterrupt), _interrupt_once_connected():
        os.kill(os.getpid(), signal.SIGINT)
        finished = True  # the interrupt did not cut the block short
    assert finished
    assert signal.getsignal(signal.SIGINT) is before


def test_no_interrupt_means_no_exception():
    before = signal.getsignal(signal.SIGINT)
    with _interrupt_once_connected():
        pass
    assert signal.getsignal(signal.SIGINT) is before


def test_a_handler_set_inside_the_block_is_kept():
    """SparkContext installs its own SIGINT handler while it starts: that one stays."""
    def sparks_own(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    before = signal.getsignal(signal.SIGINT)
    try:
        with _interrupt_once_connected():
            signal.signal(signal.SIGINT, sparks_own)
        assert signal.getsignal(signal.SIGINT) is sparks_own
    finally:
        signal.signal(signal.SIGINT, before)
