"""`cdcflow.spark.worker_heap`: a Spark task's worker freezes its heap once it has grown past
the limit; the driver's heap is never frozen."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from cdcflow.spark.worker_heap import FREEZE_AFTER, freeze_if_grown, settle_task_heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


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


def test_a_task_freezes_again_only_past_half_the_frozen_count(unfrozen: None, monkeypatch):
    """Each freeze multiplies the frozen count by at least 1.5: few freezes in a long life,
    so few cycles frozen with a task's garbage."""
    import pyspark

    monkeypatch.setattr(pyspark.TaskContext, "get", classmethod(lambda cls: object()))
    assert settle_task_heap()  # the first task: the imports
    frozen = gc.get_freeze_count()
    assert frozen > 2 * FREEZE_AFTER + 2_000  # this process's heap, as a worker's
    kept = [[] for _ in range(FREEZE_AFTER + 1_000)]  # past FREEZE_AFTER, not half
    assert not settle_task_heap()
    assert gc.get_freeze_count() == frozen
    kept += [[] for _ in range(frozen // 2)]
    assert settle_task_heap()
    assert gc.get_freeze_count() >= frozen * 3 // 2
    assert len(kept) > frozen // 2
