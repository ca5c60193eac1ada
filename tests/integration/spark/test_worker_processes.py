"""The Python workers of cdcflow's sessions: they reach their JVM over Unix domain sockets
(`WORKER_SOCKETS`), and each freezes its heap in its first task (`cdcflow.spark.worker_heap`)
so that the collection pyspark runs after every task is short."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from cdcflow import Database
from cdcflow.spark.session import WORKER_SOCKETS, _settings
from cdcflow.spark.worker_heap import FREEZE_AFTER, settle_task_heap

pytestmark = pytest.mark.integration

KEY = "spark.python.unix.domain.socket.enabled"


def _heap_after_settling(_: object) -> list[tuple[int, int]]:
    settle_task_heap()
    return [(gc.get_freeze_count(), len(gc.get_objects()))]


def test_every_task_runs_on_a_frozen_heap_within_the_limits(spark):
    counts = spark.sparkContext.parallelize(range(4), 4).mapPartitions(
        _heap_after_settling).collect()
    assert len(counts) == 4
    for frozen, walked in counts:
        assert frozen > FREEZE_AFTER  # the worker's imports, out of the collector's way
        assert walked <= max(FREEZE_AFTER, frozen // 2)  # what a collection still walks


def test_workers_use_unix_sockets_and_a_caller_can_turn_them_off(spark, tmp_path: Path):
    assert spark.conf.get(KEY) == WORKER_SOCKETS[KEY] == "true"
    assert _settings(False, {KEY.replace(".", "_"): "false"}, True)[KEY] == "false"
    db = Database.open(str(tmp_path / "db"))  # a source read runs its tasks over them
    db.ddl("CREATE TABLE T (K INT64 NOT NULL) PRIMARY KEY (K)")
    with db.transaction() as tx:
        tx.insert("T", {"K": 1})
    rows = spark.read.format("cdcflow").option("database", str(tmp_path / "db")).option(
        "table", "T").load().collect()
    assert [r["K"] for r in rows] == [1]
