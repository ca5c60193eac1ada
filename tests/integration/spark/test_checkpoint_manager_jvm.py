"""The checkpoint file manager that `cdcflow prepare` compiles (cdcflow.spark.checkpoint_files):
the suite's session uses it, it writes, renames, refuses and cancels entries as Spark's own
manager does, it starts no process per entry where Spark's starts three, and a stream's
checkpoint written by it continues."""

from __future__ import annotations

from pathlib import Path

import pytest
from py4j.protocol import Py4JJavaError

from cdcflow import Database
from cdcflow.spark import apply_change_stream
from cdcflow.spark.checkpoint_files import MANAGER_CLASS, MANAGER_KEY, usable_jar
from cdcflow.table import CdcTable

pytestmark = pytest.mark.integration

_PACKAGE = "org.apache.spark.sql.execution.streaming.checkpointing"


def _manager(spark, folder: Path, class_name: str | None = None):
    """The manager a query of this session gets for `folder` (Spark's own factory), or an
    instance of `class_name`."""
    jvm = spark._jvm
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    path = jvm.org.apache.hadoop.fs.Path(str(folder))
    if class_name is not None:
        return getattr(jvm, class_name)(path, conf)
    return jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager \
        .create(path, conf)


def _write(spark, manager, path: Path, data: bytes, overwrite: bool) -> None:
    stream = manager.createAtomic(spark._jvm.org.apache.hadoop.fs.Path(str(path)), overwrite)
    stream.write(bytearray(data))
    stream.close()


def _processes_started() -> int:
    """Processes and threads the machine has started since boot (/proc/stat)."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("processes "):
            return int(line.split()[1])
    raise AssertionError("/proc/stat has no processes line")


def test_the_suites_session_checkpoints_through_cdcflows_manager(spark, tmp_path: Path):
    assert usable_jar() is not None, "run `cdcflow prepare` (make test does) to compile it"
    assert spark.conf.get(MANAGER_KEY) == MANAGER_CLASS
    assert _manager(spark, tmp_path).getClass().getName() == MANAGER_CLASS


def test_entries_are_written_aside_renamed_refused_and_cancelled(spark, tmp_path: Path):
    manager = _manager(spark, tmp_path)
    folder = tmp_path / "offsets" / "deep"
    manager.mkdirs(spark._jvm.org.apache.hadoop.fs.Path(str(folder)))
    assert folder.is_dir()
    entry = folder / "0"
    _write(spark, manager, entry, b"first", overwrite=False)
    assert entry.read_bytes() == b"first"
    with pytest.raises(Py4JJavaError) as refused:
        _write(spark, manager, entry, b"second", overwrite=False)
    assert refused.value.java_exception.getClass().getName() == (
        "org.apache.hadoop.fs.FileAlreadyExistsException")
    assert entry.read_bytes() == b"first"
    _write(spark, manager, entry, b"third", overwrite=True)
    assert entry.read_bytes() == b"third"
    stream = manager.createAtomic(spark._jvm.org.apache.hadoop.fs.Path(str(folder / "1")),
                                  False)
    stream.write(bytearray(b"never"))
    stream.cancel()
    assert not (folder / "1").exists()
    assert not [p for p in folder.iterdir() if p.read_bytes() == b"never"]


def test_no_process_is_started_per_entry_where_sparks_own_manager_starts_three(
        spark, tmp_path: Path):
    """Spark's manager, instantiated beside it, is the control: the same count over the same
    writes must see its processes (Hadoop's `chmod` and `readlink`)."""
    counts = {}
    for name, class_name in (("ours", None),
                             ("spark's", f"{_PACKAGE}.FileContextBasedCheckpointFileManager")):
        folder = tmp_path / name.strip("'")
        folder.mkdir()
        manager = _manager(spark, folder, class_name)
        before = _processes_started()
        for number in range(20):
            _write(spark, manager, folder / str(number), b"{}", overwrite=False)
        counts[name] = _processes_started() - before
    assert counts["spark's"] >= 40, counts
    assert counts["ours"] < 10, counts


def test_a_stream_continues_from_a_checkpoint_the_manager_wrote(spark, tmp_path: Path):
    path = str(tmp_path / "shop.db")
    db = Database.open(path)
    db.ddl("CREATE TABLE T (K INT64 NOT NULL, V STRING(MAX)) PRIMARY KEY (K)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    checkpoint, warehouse = tmp_path / "checkpoint", tmp_path / "warehouse"
    for keys in (range(0, 15), range(15, 30)):
        with db.transaction() as tx:
            for key in keys:
                tx.insert("T", {"K": key, "V": f"v{key}"})
        query = apply_change_stream(spark, path, "S", warehouse, checkpoint,
                                    trigger={"availableNow": True})
        query.awaitTermination(120)
        assert query.exception() is None
    assert sorted((checkpoint / "commits").iterdir()) and not list(checkpoint.rglob("*.tmp"))
    rows = CdcTable.open(warehouse / "T").to_arrow().to_pylist()
    assert sorted(r["K"] for r in rows) == list(range(30))
