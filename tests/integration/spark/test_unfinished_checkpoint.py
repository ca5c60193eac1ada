"""A query SIGKILLed while Spark logged its first offsets starts again (issue 15's cluster
test found it): Spark writes `offsets/0` aside as `.0.<uuid>.tmp` and renames it; killed in
between, the temporary file stayed, and Spark 4 refused every later start of the query
(STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY: offsets "should be empty on batch 0"), so the
stream failed for good. The checkpoint here is what such a kill leaves, made from a real one."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from cdcflow import Database
from cdcflow.spark import apply_change_stream
from cdcflow.spark.queries import remove_unfinished_writes
from cdcflow.table import CdcTable

pytestmark = pytest.mark.integration


def test_a_query_killed_while_logging_its_first_offsets_starts_again(spark, tmp_path: Path):
    path = str(tmp_path / "shop.db")
    db = Database.open(path)
    db.ddl("CREATE TABLE T (K INT64 NOT NULL, V STRING(MAX)) PRIMARY KEY (K)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    with db.transaction() as tx:
        for key in range(20):
            tx.insert("T", {"K": key, "V": f"v{key}"})
    done = tmp_path / "done"
    apply_change_stream(spark, path, "S", tmp_path / "w1", done,
                        trigger={"availableNow": True}).awaitTermination(120)
    killed = tmp_path / "killed"
    (killed / "offsets").mkdir(parents=True)
    (killed / "commits").mkdir()
    shutil.copy(done / "metadata", killed / "metadata")
    name = f"0.{uuid.uuid4()}.tmp"
    shutil.copy(done / "offsets" / "0", killed / "offsets" / f".{name}")
    # Hadoop's checksummed local file system (the default before UNCHECKSUMMED_LOCAL_FILES)
    # wrote a side file beside the temporary one; a kill leaves both.
    (killed / "offsets" / f"..{name}.crc").write_bytes(b"crc\0\0\0\0\1")
    query = apply_change_stream(spark, path, "S", tmp_path / "w2", killed,
                                trigger={"availableNow": True})
    query.awaitTermination(120)
    assert query.exception() is None
    assert len(CdcTable.open(tmp_path / "w2" / "T").to_arrow()) == 20
    assert not list((killed / "offsets").glob(".*.tmp*"))
    assert (killed / "offsets" / "0").exists()


def test_only_unfinished_writes_are_removed(tmp_path: Path):
    names = {"offsets": ["0", ".0.crc", ".1.0f9a-b2.tmp", "..1.0f9a-b2.tmp.crc", "notes.tmp"],
             "commits": ["0", ".12.abc.tmp"]}
    for log, files in names.items():
        (tmp_path / log).mkdir()
        for file in files:
            (tmp_path / log / file).write_text("x")
    assert remove_unfinished_writes(tmp_path) == [
        "commits/.12.abc.tmp", "offsets/..1.0f9a-b2.tmp.crc", "offsets/.1.0f9a-b2.tmp"]
    assert sorted(p.name for p in (tmp_path / "offsets").iterdir()) == [".0.crc", "0",
                                                                        "notes.tmp"]
    assert remove_unfinished_writes(tmp_path / "none") == []
