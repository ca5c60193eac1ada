"""WAL checkpoints on a thread of their own while a worker appends (CS-5: nothing written
is lost or changed by who copies the WAL)."""

from __future__ import annotations

import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cdcflow.model.changes import SourceChange, SourceTransaction
from cdcflow.model.records import ColumnTypeInfo
from cdcflow.model.source import SourceMetadata
from cdcflow.model.types import ColumnType
from cdcflow.store.changelog import ChangeLog

pytestmark = pytest.mark.unit

COLUMNS = (ColumnTypeInfo("id", ColumnType("INT64"), True, 1),
           ColumnTypeInfo("note", ColumnType("STRING"), False, 2))


def batch(first: int, count: int) -> list[SourceTransaction]:
    metadata = SourceMetadata("postgres-cdc-wal", datetime(2026, 1, 1, tzinfo=UTC), str(first))
    return [SourceTransaction(metadata, (SourceChange(
        "public.t", "INSERT", {"id": n}, {"note": "x" * 500}, {}, COLUMNS, "NEW_ROW",
        {"lsn": f"0/{n + 1:X}"}),)) for n in range(first, first + count)]


def autocheckpoint(log: ChangeLog) -> int:
    (pages,) = log._session().conn.execute("PRAGMA wal_autocheckpoint").fetchone()
    return int(pages)


def test_a_thread_checkpoints_while_the_writer_does_not_and_nothing_is_lost(tmp_path: Path):
    log = ChangeLog.open(tmp_path / "log.db")
    log.ensure_change_stream("changes")
    after = None
    with log.checkpoints_in_background() as checkpoints:
        assert autocheckpoint(log) == 0
        deadline = time.monotonic() + 60
        while checkpoints.checkpoints < 2:  # poll: the thread runs on its own schedule
            assert time.monotonic() < deadline, "no background checkpoint within 60 s"
            position = {"end_lsn": f"1/{checkpoints.checkpoints}-{time.monotonic_ns()}"}
            log.append_many("pg", batch(0, 200), after, position)
            after = position
    assert autocheckpoint(log) == 1000
    conn = sqlite3.connect(tmp_path / "log.db")
    busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    assert busy == 0 and frames == copied  # a whole WAL, every frame of it copyable
    (records,) = conn.execute("SELECT COUNT(*) FROM _log WHERE kind = 0").fetchone()
    assert records >= 400 and records % 200 == 0


def test_a_reader_holding_a_snapshot_does_not_stop_the_appends(tmp_path: Path):
    log = ChangeLog.open(tmp_path / "log.db")
    log.ensure_change_stream("changes")
    log.append_many("pg", batch(0, 50), None, {"end_lsn": "1/0"})
    reader = sqlite3.connect(tmp_path / "log.db", isolation_level=None)
    reader.execute("BEGIN")
    (before,) = reader.execute("SELECT COUNT(*) FROM _log").fetchone()
    with log.checkpoints_in_background():
        log.append_many("pg", batch(50, 50), {"end_lsn": "1/0"}, {"end_lsn": "1/1"})
    (still,) = reader.execute("SELECT COUNT(*) FROM _log").fetchone()
    reader.execute("COMMIT")
    (now,) = reader.execute("SELECT COUNT(*) FROM _log").fetchone()
    assert still == before and now > before
