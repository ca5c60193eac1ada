"""The Python workers of cdcflow's sessions: with a local master they reach their JVM over
Unix domain sockets in a private folder (`worker_sockets`), and each freezes its heap in its
first cdcflow task (`cdcflow.spark.worker_heap`) so that the collection pyspark runs after
every task is short."""

from __future__ import annotations

import gc
import os
import stat
from pathlib import Path

import pytest

from cdcflow import Database
from cdcflow.spark.session import SOCKETS_DIR_KEY, SOCKETS_KEY, _settings, worker_sockets
from cdcflow.spark.worker_heap import FREEZE_AFTER, settle_task_heap

pytestmark = pytest.mark.integration


def _heap_after_settling(_: object) -> list[tuple[int, int]]:
    settle_task_heap()
    return [(gc.get_freeze_count(), len(gc.get_objects()))]


def _worker_environment(_: object) -> list[tuple[str | None, str | None]]:
    return [(os.environ.get("PYTHON_UNIX_DOMAIN_ENABLED", "").lower(),
             os.environ.get("PYTHON_WORKER_FACTORY_SOCK_DIR"))]


def test_every_task_runs_on_a_frozen_heap(spark):
    counts = spark.sparkContext.parallelize(range(4), 4).mapPartitions(
        _heap_after_settling).collect()
    assert len(counts) == 4
    for frozen, walked in counts:
        assert frozen > FREEZE_AFTER  # the worker's imports, out of the collector's way
        assert walked <= max(FREEZE_AFTER, frozen // 2)  # what a collection still walks


def test_workers_use_unix_sockets_in_a_private_folder(spark, tmp_path: Path):
    folder = spark.conf.get(SOCKETS_DIR_KEY)
    assert spark.conf.get(SOCKETS_KEY) == "true"
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    environments = spark.sparkContext.parallelize(range(2), 2).mapPartitions(
        _worker_environment).collect()
    assert environments == [("true", folder)] * 2
    db = Database.open(str(tmp_path / "db"))  # a source read runs its tasks over them
    db.ddl("CREATE TABLE T (K INT64 NOT NULL) PRIMARY KEY (K)")
    with db.transaction() as tx:
        tx.insert("T", {"K": 1})
    rows = spark.read.format("cdcflow").option("database", str(tmp_path / "db")).option(
        "table", "T").load().collect()
    assert [r["K"] for r in rows] == [1]


def test_only_local_masters_get_unix_sockets_and_a_caller_can_turn_them_off():
    assert worker_sockets("spark://127.0.0.1:7077") == {}  # executors elsewhere
    assert worker_sockets(None) == {}  # spark-submit's master: its settings decide
    assert _settings(False, {}, True, "local[2]")[SOCKETS_KEY] == "true"
    chosen = {SOCKETS_KEY.replace(".", "_"): "false"}
    assert _settings(False, chosen, True, "local[2]")[SOCKETS_KEY] == "false"
