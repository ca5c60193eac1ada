"""The embedded source: its objects, a pinned snapshot that outlives the version retention
until it is released, and no capture worker (its commits write their own records)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from cdcflow import Database, FakeClock
from cdcflow.capture.embedded import EmbeddedSource
from cdcflow.errors import FailedPrecondition, OutOfRange

pytestmark = pytest.mark.unit


def test_a_pinned_snapshot_outlives_the_version_retention_until_released(db_path: str):
    clock = FakeClock()
    db = Database.open(db_path, clock=clock)
    db.ddl("CREATE TABLE T (Id INT64 NOT NULL, V INT64) PRIMARY KEY (Id)")
    db.ddl("CREATE CHANGE STREAM S FOR T")
    with db.transaction() as tx:
        tx.insert("T", {"Id": 1, "V": 1})
    source = EmbeddedSource(db_path, "S")
    source.database.clock = clock
    (item,) = source.discover()
    assert (item.name, item.primary_key) == ("T", ("Id",))
    snapshot = source.snapshot([item], None)
    with db.transaction() as tx:
        tx.update("T", {"Id": 1, "V": 2})
    clock.advance(timedelta(hours=2))  # a backfill interrupted for two hours
    db.enforce_retention()
    again = source.snapshot([item], snapshot.position)  # resumes the same snapshot
    rows: list[dict] = []
    source.backfill(again, [item], lambda _, chunk, after: rows.extend(chunk))
    assert rows == [{"Id": 1, "V": 1}]
    source.release(again)
    db.enforce_retention()
    with pytest.raises(OutOfRange, match="version retention"):
        db.scan("T", read_timestamp=snapshot.read_timestamp)
    with pytest.raises(OutOfRange, match="not pinned"):
        source.snapshot([item], snapshot.position)


def test_the_embedded_source_has_no_capture_worker(db_path: str):
    db = Database.open(db_path)
    db.ddl("CREATE TABLE T (Id INT64 NOT NULL) PRIMARY KEY (Id)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    source = EmbeddedSource(db_path, "S")
    assert source.has_worker is False and source.log_location() == (db_path, "S")
    with pytest.raises(FailedPrecondition, match="no capture worker"):
        source.capture(source.database, None)  # type: ignore[arg-type]


def test_a_backfill_goes_on_after_its_last_chunk(db_path: str, monkeypatch: pytest.MonkeyPatch):
    from cdcflow.capture import embedded

    monkeypatch.setattr(embedded, "_CHUNK_ROWS", 4)
    db = Database.open(db_path)
    db.ddl("CREATE TABLE T (Id INT64 NOT NULL) PRIMARY KEY (Id)")
    db.ddl("CREATE CHANGE STREAM S FOR T")
    with db.transaction() as tx:
        for i in range(10):
            tx.insert("T", {"Id": i})
    source = EmbeddedSource(db_path, "S")
    (item,) = source.discover()
    snapshot = source.snapshot([item], None)
    chunks: list[tuple[list[int], str]] = []
    source.backfill(snapshot, [item], lambda _, rows, after: chunks.append(
        ([r["Id"] for r in rows], after)))
    assert [len(ids) for ids, _ in chunks] == [4, 4, 2]
    rest: list[int] = []
    source.backfill(snapshot, [item], lambda _, rows, after: rest.extend(r["Id"] for r in rows),
                    {"T": chunks[0][1]})
    assert sorted(chunks[0][0] + rest) == list(range(10))
    done: list[int] = []
    source.backfill(snapshot, [item], lambda _, rows, after: done.extend(rows), {"T": "done"})
    assert done == []
