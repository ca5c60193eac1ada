"""What the runner records of a streaming query that failed (`spark.failure_text.described`),
from real Spark failures: the executor's exception, or the crash of its Python worker, is
in the record whole, within the limit, without Java frames or the query's plan. Before,
the record was the failure's first 2,000 characters, and those were the driver's py4j
frames: a CI failure on a cluster showed no cause at all."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from cdcflow.spark.failure_text import MESSAGE_LIMIT, described

pytestmark = pytest.mark.integration


def _failure_of(spark: Any, fail: Any) -> BaseException:
    """The failure of a streaming query whose first batch runs `fail` in a task after a
    shuffle, as the pipeline's batches do (`repartition`, `mapInArrow`, `collect`)."""

    def batch(frame: Any, batch_id: int) -> None:
        frame.repartition(2).mapInArrow(fail, frame.schema).collect()

    query = (spark.readStream.format("rate").option("rowsPerSecond", 50).load()
             .writeStream.foreachBatch(batch).start())
    try:
        with contextlib.suppress(Exception):  # the failure is read from the query below
            query.awaitTermination(120)
        failure = query.exception()
    finally:
        query.stop()
    assert failure is not None, "the query did not fail"
    return RuntimeError(f"the streaming query failed: {failure}")


def _raises(batches: Iterator[Any]) -> Iterator[Any]:
    for batch in batches:
        raise ValueError(f"the executor's own failure, {batch.num_rows} rows in")
    yield from ()


def _crashes(batches: Iterator[Any]) -> Iterator[Any]:
    for _ in batches:
        os.kill(os.getpid(), signal.SIGSEGV)
    yield from ()


def test_an_executor_exception_is_recorded_with_its_cause(spark):
    failure = _failure_of(spark, _raises)
    text = described(failure)
    assert "ValueError: the executor's own failure" in text, text
    assert text.startswith("RuntimeError: the streaming query failed:")
    assert "\tat " not in text and "=== Streaming Query ===" not in text
    assert len(text) <= MESSAGE_LIMIT


def test_a_crashed_python_worker_is_recorded_with_its_python_stack(spark):
    """The session turns on Python's fault handler in workers (`CRASH_TRACEBACKS`): the
    crash's record names the signal and the function that crashed, not only "exited
    unexpectedly"."""
    failure = _failure_of(spark, _crashes)
    text = described(failure)
    assert "Python worker exited unexpectedly (crashed)" in text, text
    assert "Segmentation fault" in text and "_crashes" in text, text
    assert "\tat " not in text and len(text) <= MESSAGE_LIMIT
