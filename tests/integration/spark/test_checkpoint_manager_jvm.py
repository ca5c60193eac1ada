"""The checkpoint file manager that `cdcflow prepare` compiles (cdcflow.spark.checkpoint_files):
the suite's session uses it, and a session whose JVM can't load it does not; it writes,
renames, refuses and cancels entries as Spark's own manager does; it starts no process per
entry where Spark's starts three; a path on another file system goes to Spark's own choice;
and a stream's checkpoint written by it continues."""

from __future__ import annotations

from pathlib import Path

import pytest
from py4j.protocol import Py4JJavaError

from cdcflow import Database
from cdcflow.spark import apply_change_stream, checkpoint_files
from cdcflow.spark.checkpoint_files import MANAGER_CLASS, MANAGER_KEY, usable_jar, use_manager
from cdcflow.table import CdcTable

pytestmark = pytest.mark.integration

_PACKAGE = "org.apache.spark.sql.execution.streaming.checkpointing"


def _manager(spark, folder: Path | str, class_name: str | None = None):
    """The manager a query of this session gets for `folder` (Spark's own factory), or an
    instance of `class_name`."""
    jvm = spark._jvm
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    path = jvm.org.apache.hadoop.fs.Path(str(folder))
    if class_name is not None:
        return getattr(jvm, class_name)(path, conf)
    return jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager \
        .create(path, conf)


def _write(spark, manager, path: Path | str, data: bytes, overwrite: bool) -> None:
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


def _count_processes(spark, manager, folder: Path) -> int:
    """Processes and threads started on the machine while `manager` makes a folder and writes
    20 new entries and 10 replacements in it."""
    before = _processes_started()
    manager.mkdirs(spark._jvm.org.apache.hadoop.fs.Path(str(folder)))
    for number in range(20):
        _write(spark, manager, folder / str(number), b"{}", overwrite=False)
    for number in range(10):
        _write(spark, manager, folder / str(number), b"{}", overwrite=True)
    return _processes_started() - before


def test_no_process_is_started_per_entry_where_sparks_own_manager_starts_three(
        spark, tmp_path: Path):
    """Spark's manager, instantiated beside it, is the control: the same count over the same
    calls must see its processes (Hadoop's `chmod` and `readlink`). The count is the whole
    machine's, so ours is the least of three tries: other processes only add to it."""
    theirs = _count_processes(
        spark, _manager(spark, tmp_path, f"{_PACKAGE}.FileContextBasedCheckpointFileManager"),
        tmp_path / "theirs")
    ours = min(_count_processes(spark, _manager(spark, tmp_path), tmp_path / f"ours{n}")
               for n in range(3))
    assert theirs >= 60, theirs
    assert ours < 5, ours


def test_a_path_on_another_file_system_goes_to_sparks_own_choice(spark, tmp_path: Path):
    """viewfs, Hadoop's mount table, here over a local folder: the manager hands every call
    to the manager Spark chooses for that file system."""
    key = "fs.viewfs.mounttable.cdcflowtest.link./checkpoint"
    spark.conf.set(key, f"file://{tmp_path}")
    try:
        manager = _manager(spark, "viewfs://cdcflowtest/checkpoint/offsets")
        assert manager.getClass().getName() == MANAGER_CLASS
        manager.mkdirs(spark._jvm.org.apache.hadoop.fs.Path(
            "viewfs://cdcflowtest/checkpoint/offsets"))
        _write(spark, manager, "viewfs://cdcflowtest/checkpoint/offsets/0", b"v1",
               overwrite=False)
        assert (tmp_path / "offsets" / "0").read_bytes() == b"v1"
        assert manager.exists(spark._jvm.org.apache.hadoop.fs.Path(
            "viewfs://cdcflowtest/checkpoint/offsets/0"))
    finally:
        spark.conf.unset(key)


def test_a_jvm_that_cannot_load_the_manager_keeps_sparks_own(
        spark, monkeypatch: pytest.MonkeyPatch):
    """As for a JVM started before `cdcflow prepare`, or by spark-submit without the jar:
    naming a class it can't load would fail every streaming query."""
    spark.conf.unset(MANAGER_KEY)
    try:
        monkeypatch.setattr(checkpoint_files, "MANAGER_CLASS", "cdcflow.jvm.NoSuchManager")
        assert use_manager(spark, caller_chose=False) is False
        assert spark.conf.get(MANAGER_KEY, None) is None
        monkeypatch.undo()
        assert use_manager(spark, caller_chose=True) is False
        assert spark.conf.get(MANAGER_KEY, None) is None
    finally:
        monkeypatch.undo()
        assert use_manager(spark, caller_chose=False) is True
    assert spark.conf.get(MANAGER_KEY) == MANAGER_CLASS
    assert use_manager(spark, caller_chose=False) is False, "already set: left as it is"


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
