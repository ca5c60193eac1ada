"""The driver seals a batch's slices for executors (issue 15): a large slice is cut into
segments between commit timestamps, each its own task; the rows read from the segments are
the rows read from the log; a second sealing (a replayed batch) makes the same segments."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pyarrow as pa
import pytest

from cdcflow import Database
from cdcflow.errors import FailedPrecondition
from cdcflow.model.timestamps import to_micros
from cdcflow.spark import reading
from cdcflow.spark.options import parse_options
from cdcflow.spark.reading import change_slices, read_changes, seal_slices
from cdcflow.store.changelog import open_log

pytestmark = pytest.mark.unit


def rows(pieces: list[reading.ChangeSlice]) -> list[dict]:
    return [row for piece in pieces for batch in read_changes(piece)
            for row in pa.Table.from_batches([batch]).to_pylist()]


@pytest.mark.parametrize("raw", [False, True])
def test_a_large_slice_is_sealed_in_parts_that_read_as_the_log(
        db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raw: bool):
    db.ddl("CREATE TABLE T (K INT64 NOT NULL, V STRING(MAX)) PRIMARY KEY (K)")
    db.ddl("CREATE TABLE U (K INT64 NOT NULL, V STRING(MAX)) PRIMARY KEY (K)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    start = to_micros(db.current_timestamp())
    for number in range(30):  # two tables: a transaction is several entries of one timestamp
        with db.transaction() as tx:
            for key in range(number % 4 + 1):
                tx.insert_or_update("T", {"K": number * 10 + key, "V": "x" * 50})
                tx.insert_or_update("U", {"K": number * 10 + key, "V": "y" * 50})
    end = to_micros(db.current_timestamp())
    flags = {"rawRecords": "true"} if raw else {}
    local = parse_options({"database": db.path, "stream": "S", **flags})
    shared = parse_options({"database": db.path, "stream": "S", **flags,
                            "segmentRoot": str(tmp_path / "segments")})
    partitions = open_log(db.path).partitions("S")
    monkeypatch.setattr(reading, "SEGMENT_BYTES", 500)  # less than an entry
    parts = seal_slices(change_slices(shared, partitions, start, end))
    [whole] = change_slices(local, partitions, start, end)
    if raw:
        assert len(parts) == 1  # heartbeats and child records belong to the slice's end
    else:
        assert len(parts) > 5
        assert [(p.after, p.until) for p in parts] == sorted((p.after, p.until) for p in parts)
        assert parts[0].after == start and parts[-1].until == end
        assert all(a.until == b.after for a, b in pairwise(parts))
        stamps = [{r["commit_timestamp"] for r in rows([p])} for p in parts]
        assert all(not (a & b) for a, b in pairwise(stamps)), "a transaction was cut"
    assert rows(parts) == rows([whole]) and len(rows(parts)) >= 30
    files = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.arrow"))
    assert len(files) == len(parts)
    again = seal_slices(change_slices(shared, partitions, start, end))
    assert again == parts
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.arrow")) == files


def test_a_committed_batch_drops_its_segments_and_not_the_next_ones(db: Database,
                                                                    tmp_path: Path):
    """Spark calls commit(end of batch N - 1) as batch N runs: N's segments must stay. A
    half-written segment a killed driver left is swept when the query starts."""
    from cdcflow.spark.source import ChangeStreamReader

    db.ddl("CREATE TABLE T (K INT64 NOT NULL) PRIMARY KEY (K)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    stamps = [to_micros(db.current_timestamp())]
    for batch in range(2):
        for key in range(3):
            with db.transaction() as tx:
                tx.insert("T", {"K": batch * 10 + key})
        stamps.append(to_micros(db.current_timestamp()))
    root = tmp_path / "segments"
    left = [root / "P1" / f".{'a' * 32}.part", root / "snapshots" / "T@1" / f".{'b' * 32}.part"]
    for stray in left:  # a driver killed while sealing, and a snapshot read's file
        stray.parent.mkdir(parents=True)
        stray.write_bytes(b"half")
    reader = ChangeStreamReader(parse_options({"database": db.path, "stream": "S",
                                               "segmentRoot": str(root)}), open_log(db.path))
    assert [p.exists() for p in left] == [False, True]  # the query's start swept its own
    offsets = [reader._offset_at(stamp).to_dict() for stamp in stamps]
    first = reader.partitions(offsets[0], offsets[1])
    second = reader.partitions(offsets[1], offsets[2])
    assert len(list(root.rglob("*.arrow"))) == 2
    reader.commit(offsets[1])
    assert [p.name for p in root.rglob("*.arrow")] == [f"{stamps[1]}-{stamps[2]}.arrow"]
    assert sum(len(list(reader.read(p))) for p in second) == 1
    assert [row["keys"] for p in second for b in reader.read(p)
            for row in pa.Table.from_batches([b]).to_pylist()] == ['{"K":10}', '{"K":11}',
                                                                   '{"K":12}']
    assert first and all(p.piece.until <= stamps[1] for p in first)


def test_a_table_snapshot_read_with_a_segment_root_needs_no_database_on_executors(
        db: Database, tmp_path: Path):
    """Issue 15: the driver writes each key-hash slice of a snapshot under the root; the
    tasks read those files, the same rows as from the database, even once the database is
    out of their reach. Planning again reuses the files; a damaged one is named."""
    from cdcflow.spark.source import SnapshotReader

    db.ddl("CREATE TABLE T (K INT64 NOT NULL, V STRING(MAX), J JSON) PRIMARY KEY (K)")
    with db.transaction() as tx:
        for key in range(300):
            tx.insert("T", {"K": key, "V": f"v{key}", "J": {"b": key, "a": [key]}})
    when = db.current_timestamp()
    with db.transaction() as tx:
        tx.delete("T", {"K": 0})  # after the snapshot: still read
    stamp = when.isoformat()
    local = SnapshotReader(parse_options({"database": db.path, "table": "T",
                                          "readTimestamp": stamp}), db)
    root = tmp_path / "shared"
    shared = SnapshotReader(parse_options({"database": db.path, "table": "T",
                                           "readTimestamp": stamp,
                                           "segmentRoot": str(root)}), db)
    expected = [r for p in local.partitions() for b in local.read(p)
                for r in pa.Table.from_batches([b]).to_pylist()]
    pieces = shared.partitions()
    files = sorted(root.rglob("*.snapshot.arrow"))
    assert len(files) == 4 and len(expected) == 300
    written = sealed_once(files)
    again = [p.piece for p in shared.partitions()]
    assert again == [p.piece for p in pieces] and sealed_once(files) == written  # found, kept
    db.close()
    moved = tmp_path / "elsewhere.db"
    Path(db.path).rename(moved)  # executors can't open the database
    got = [r for p in pieces for b in shared.read(p)
           for r in pa.Table.from_batches([b]).to_pylist()]
    assert got == expected
    files[1].write_bytes(b"not arrow")
    with pytest.raises(FailedPrecondition, match=r"snapshot file .* can't be read"):
        list(shared.read(pieces[1]))


def test_snapshot_files_of_two_databases_sharing_a_root_stay_apart(tmp_path: Path):
    """Same table name, same readTimestamp, one root: each read gets its own database's
    rows, never the files the other sealed."""
    from cdcflow.spark.source import SnapshotReader

    databases = []
    for name, value in (("a.db", "from A"), ("b.db", "from B")):
        database = Database.open(str(tmp_path / name))
        database.ddl("CREATE TABLE T (K INT64 NOT NULL, V STRING(MAX)) PRIMARY KEY (K)")
        with database.transaction() as tx:
            tx.insert("T", {"K": 1, "V": value})
        databases.append(database)
    stamp = max(d.current_timestamp() for d in databases).isoformat()
    seen = []
    for database in databases:
        reader = SnapshotReader(parse_options({
            "database": database.path, "table": "T", "readTimestamp": stamp,
            "segmentRoot": str(tmp_path / "shared")}), database)
        seen.append([row["V"] for p in reader.partitions() for b in reader.read(p)
                     for row in pa.Table.from_batches([b]).to_pylist()])
        database.close()
    assert seen == [["from A"], ["from B"]]


def sealed_once(files: list[Path]) -> list[tuple[str, int]]:
    return [(f.name, f.stat().st_mtime_ns) for f in files]
