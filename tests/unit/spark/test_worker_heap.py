"""`cdcflow.spark.worker_heap`: a reused Spark task's worker freezes its heap in its first
cdcflow task and again only past half the most it ever froze; never on the driver, in a
worker that is not reused, or when switched off. Every executor entry point settles first."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pyarrow as pa
import pytest

from cdcflow.spark import pipeline, reading, sink, worker_heap
from cdcflow.spark.reading import ChangeSlice, SnapshotSlice
from cdcflow.spark.worker_heap import FREEZE_AFTER, SWITCH, freeze_if_grown, settle_task_heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


@pytest.fixture
def in_a_task(monkeypatch: pytest.MonkeyPatch, unfrozen: None) -> None:
    """As in a reused worker of a Spark task: a TaskContext, SPARK_REUSE_WORKER, nothing
    frozen yet."""
    import pyspark

    monkeypatch.setattr(pyspark.TaskContext, "get", classmethod(lambda cls: object()))
    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    monkeypatch.delenv(SWITCH, raising=False)
    monkeypatch.setattr(worker_heap, "_frozen_peak", 0)


def test_a_heap_past_the_limit_is_frozen(unfrozen: None):
    tracked = len(gc.get_objects())
    assert freeze_if_grown(tracked - 1)
    assert gc.get_freeze_count() >= tracked
    assert len(gc.get_objects()) < tracked  # what the collector still walks


def test_a_heap_within_the_limit_is_left_as_it_is(unfrozen: None):
    tracked = len(gc.get_objects())
    assert not freeze_if_grown(tracked + 1_000)
    assert gc.get_freeze_count() == 0


def test_the_driver_never_freezes(unfrozen: None):
    """No task runs in this process (pyspark's TaskContext is None), as on the driver."""
    assert not settle_task_heap()
    assert gc.get_freeze_count() == 0


def test_a_worker_that_is_not_reused_or_is_switched_off_never_freezes(
        in_a_task: None, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("SPARK_REUSE_WORKER")  # pyspark runs no collection after its task
    assert not settle_task_heap()
    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    monkeypatch.setenv(SWITCH, "0")
    assert not settle_task_heap()
    assert gc.get_freeze_count() == 0
    monkeypatch.setenv(SWITCH, "1")
    assert settle_task_heap()


def test_a_task_freezes_again_only_past_half_the_most_ever_frozen(in_a_task: None):
    """Each freeze raises the high-water mark by half: few freezes in a long life, so few
    cycles frozen with a task's garbage. Frozen objects that are freed lower the frozen
    count, not the mark."""
    doomed = [[] for _ in range(3 * FREEZE_AFTER)]
    assert settle_task_heap()  # the first task: the imports
    peak = gc.get_freeze_count()
    assert peak > 2 * FREEZE_AFTER + 2_000  # this process's heap, as a worker's
    del doomed  # frozen and freed: the permanent generation shrinks
    assert gc.get_freeze_count() < peak - 2 * FREEZE_AFTER
    kept = [[] for _ in range(FREEZE_AFTER + 1_000)]  # past FREEZE_AFTER, not half the peak
    assert not settle_task_heap()
    kept += [[] for _ in range(peak // 2)]
    assert settle_task_heap()
    assert len(kept) > peak // 2


class _Settled(Exception):
    pass


def _settle_first() -> bool:
    raise _Settled


@pytest.mark.parametrize("entry", ["read_changes", "read_snapshot", "process_partition",
                                   "sink"])
def test_every_executor_entry_point_settles_the_heap_first(
        entry: str, monkeypatch: pytest.MonkeyPatch):
    for module in (reading, pipeline, sink):
        monkeypatch.setattr(module, "settle_task_heap", _settle_first)
    calls = {
        "read_changes": lambda: reading.read_changes(
            ChangeSlice("none.db", "S", "t", 0, 1, None, 1000, False)),
        "read_snapshot": lambda: reading.read_snapshot(
            SnapshotSlice("none.db", "T", 1, 0, 1)),
        "process_partition": lambda: pipeline.process_partition(
            None, pipeline.BatchWork(0), iter([])),  # type: ignore[arg-type]
        "sink": lambda: sink._partition_writer("none", pa.schema([]), ())(iter([])),
    }
    with pytest.raises(_Settled):
        next(iter(calls[entry]()))
