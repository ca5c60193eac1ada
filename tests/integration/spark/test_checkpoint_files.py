"""The checkpoint's offset and commit logs are written through Hadoop's raw local file system
(`UNCHECKSUMMED_LOCAL_FILES`): no `.crc` side file per entry, and side files that a
checksummed writer left in an older checkpoint are ignored, so such a checkpoint continues.
Hadoop's FileSystem API keeps its checksummed class, which `sc.textFile` needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdcflow import Database
from cdcflow.spark import apply_change_stream
from cdcflow.spark.session import UNCHECKSUMMED_LOCAL_FILES, _settings
from cdcflow.table import CdcTable

pytestmark = pytest.mark.integration


def _insert(db: Database, keys: range) -> None:
    with db.transaction() as tx:
        for key in keys:
            tx.insert("T", {"K": key, "V": f"v{key}"})


def _run_to_end(spark, path: str, warehouse: Path, checkpoint: Path) -> None:
    query = apply_change_stream(spark, path, "S", warehouse, checkpoint,
                                trigger={"availableNow": True})
    query.awaitTermination(120)
    assert query.exception() is None


def test_logs_have_no_crc_files_and_left_over_ones_are_ignored(spark, tmp_path: Path):
    path = str(tmp_path / "shop.db")
    db = Database.open(path)
    db.ddl("CREATE TABLE T (K INT64 NOT NULL, V STRING(MAX)) PRIMARY KEY (K)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    _insert(db, range(20))
    checkpoint, warehouse = tmp_path / "checkpoint", tmp_path / "warehouse"
    _run_to_end(spark, path, warehouse, checkpoint)
    entries = [p for log in ("offsets", "commits") for p in (checkpoint / log).iterdir()]
    assert {p.name for p in entries} >= {"0"}
    assert not list(checkpoint.rglob("*.crc")), "a checksummed file system wrote side files"
    for entry in entries:  # what an older, checksummed writer left, here with wrong sums
        (entry.parent / f".{entry.name}.crc").write_bytes(b"crc\0\0\0\0\1garbage")
    _insert(db, range(20, 30))
    _run_to_end(spark, path, warehouse, checkpoint)
    assert sorted(r["K"] for r in CdcTable.open(warehouse / "T").to_arrow().to_pylist()) == (
        list(range(30)))


def test_the_filesystem_api_keeps_its_checksummed_class(spark, tmp_path: Path):
    """Hadoop's `FileSystem.getLocal` (every `sc.textFile`, `hadoopFile`...) casts to the
    checksummed class: only FileContext's key is changed, so those reads still work."""
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    key = "spark.hadoop.fs.AbstractFileSystem.file.impl"
    assert conf.get(key.removeprefix("spark.hadoop.")) == UNCHECKSUMMED_LOCAL_FILES[key]
    assert conf.get("fs.file.impl") is None
    text = tmp_path / "lines.txt"
    text.write_text("one\ntwo\n")
    assert spark.sparkContext.textFile(str(text)).collect() == ["one", "two"]


def test_a_callers_own_file_system_setting_wins():
    key = "spark.hadoop.fs.AbstractFileSystem.file.impl"
    chosen = {key.replace(".", "_"): "org.apache.hadoop.fs.local.LocalFs"}
    assert _settings(False, chosen, False)[key] == "org.apache.hadoop.fs.local.LocalFs"
    assert _settings(False, {}, False)[key] == "org.apache.hadoop.fs.local.RawLocalFs"
