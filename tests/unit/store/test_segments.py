"""Sealed log segments (issue 15): a slice of the log as one immutable Arrow IPC file under a
storage root; the same entries as the log, sealed once, named by its range, dropped once a
committed batch no longer needs it; bad roots and missing segments are typed errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pyarrow.fs import LocalFileSystem

from cdcflow import Database
from cdcflow.errors import FailedPrecondition, InvalidArgument
from cdcflow.model.timestamps import from_micros, to_micros
from cdcflow.store.changelog import open_log
from cdcflow.store.segments import (
    Segment,
    drop_segments_until,
    read_segment,
    seal,
    sealed_segments,
    segment_summary,
    shown,
    storage,
)


def logged(db: Database, rows: int) -> tuple[str, int, int]:
    db.ddl("CREATE TABLE T (K INT64 NOT NULL, V STRING(MAX)) PRIMARY KEY (K)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    start = to_micros(db.current_timestamp())
    for key in range(rows):
        tx = db.transaction()
        tx.insert_or_update("T", {"K": key, "V": "é" * key})
        tx.commit()
    log = open_log(db.path)
    [partition] = log.partitions("S")
    return partition.token, start, to_micros(db.current_timestamp())


def test_a_sealed_segment_holds_the_logs_entries_of_its_range(db: Database, tmp_path: Path):
    token, start, end = logged(db, 20)
    log = open_log(db.path)
    segment = Segment(str(tmp_path / "root"), token, start, end)
    size = seal(segment, log.read_log_texts("S", token, from_micros(start), from_micros(end)))
    table = read_segment(segment)
    expected = list(log.read_log_texts("S", token, from_micros(start), from_micros(end)))
    assert len(expected) == 20 and size == os.path.getsize(segment.path())
    assert list(zip(*[table.column(c).to_pylist() for c in ("kind", "commit_micros", "body")],
                    strict=True)) == expected
    assert segment.path() == f"{tmp_path}/root/{token}/{start}-{end}.arrow"
    assert [p.name for p in (tmp_path / "root" / token).iterdir()] == [f"{start}-{end}.arrow"]


def test_sealing_again_keeps_the_first_file(db: Database, tmp_path: Path):
    """A replayed batch seals the same range again: the file there is kept as it is."""
    token, start, end = logged(db, 3)
    segment = Segment(str(tmp_path), token, start, end)
    seal(segment, [("data", start + 1, "{}")])
    before = Path(segment.path()).read_bytes()
    seal(segment, [("data", start + 2, "[1]"), ("data", start + 3, "[2]")])
    assert Path(segment.path()).read_bytes() == before
    assert read_segment(segment).num_rows == 1


def test_a_damaged_segment_is_named_and_sealed_again(tmp_path: Path):
    """A segment cut short (a crash on a filesystem without atomic writes) is an error naming
    it on read, and the next sealing (the replayed batch) writes it whole again."""
    segment = Segment(str(tmp_path), "P1-x", 5, 9)
    seal(segment, [("data", 7, "{}"), ("data", 9, "[]")])
    whole = Path(segment.path()).read_bytes()
    Path(segment.path()).write_bytes(whole[: len(whole) // 2])
    with pytest.raises(FailedPrecondition, match=r"log segment '.*P1-x/5-9\.arrow' can't be "
                       r"read \(.*\): the batch seals it again"):
        read_segment(segment)
    seal(segment, [("data", 7, "{}"), ("data", 9, "[]")])
    assert read_segment(segment).column("commit_micros").to_pylist() == [7, 9]


def test_segments_are_listed_and_dropped_up_to_a_committed_end(tmp_path: Path):
    root = str(tmp_path)
    for token, after, until in (("P1-a", 0, 10), ("P1-a", 10, 20), ("P2-b", 5, 20),
                                ("P3 odd/token", 0, 30)):
        seal(Segment(root, token, after, until), [("data", until, "{}")])
    assert [(s.token, s.after, s.until) for s in sealed_segments(root)] == [
        ("P1-a", 0, 10), ("P1-a", 10, 20), ("P2-b", 5, 20), ("P3 odd/token", 0, 30)]
    summary = segment_summary(root)
    assert (summary["files"], summary["sealed_through"]) == (4, 30)
    assert summary["bytes"] == sum(p.stat().st_size for p in tmp_path.rglob("*.arrow"))
    assert drop_segments_until(root, 20) == 3
    assert [(s.token, s.until) for s in sealed_segments(root)] == [("P3 odd/token", 30)]
    assert not list(tmp_path.rglob("*.part"))
    assert segment_summary(str(tmp_path / "none")) == {
        "root": str(tmp_path / "none"), "files": 0, "bytes": 0, "sealed_through": None}


def test_a_missing_segment_is_named(tmp_path: Path):
    segment = Segment(str(tmp_path), "P1-x", 1, 2)
    with pytest.raises(FailedPrecondition, match=r"log segment '.*P1-x/1-2\.arrow' is not in"):
        read_segment(segment)


@pytest.mark.parametrize("root", ["relative/root", "", "nosuch://bucket/x"])
def test_a_storage_root_must_be_absolute_or_a_known_uri(root: str):
    with pytest.raises(InvalidArgument, match="storage root"):
        storage(root)


def test_a_file_uri_is_a_storage_root(tmp_path: Path):
    filesystem, base = storage(f"file://{tmp_path}")
    assert isinstance(filesystem, LocalFileSystem) and base == str(tmp_path)
    segment = Segment(f"file://{tmp_path}", "P1-u", 0, 1)
    seal(segment, [("data", 1, "{}")])
    assert (tmp_path / "P1-u" / "0-1.arrow").is_file()


def test_credentials_in_a_root_are_never_shown(tmp_path: Path):
    root = "s3://AKIAKEY:s3cr3t@bucket/lake"
    assert shown(root) == "s3://bucket/lake"
    assert shown(str(tmp_path)) == str(tmp_path)
    with pytest.raises(InvalidArgument) as raised:
        storage("nosuch://AKIAKEY:s3cr3t@bucket/lake")
    assert "s3cr3t" not in str(raised.value) and "AKIAKEY" not in str(raised.value)
    assert "nosuch://bucket/lake" in str(raised.value)
