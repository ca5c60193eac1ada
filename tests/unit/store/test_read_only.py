"""A database file this process may not write (CS-1, the commit journal): cdcflow keeps its
files in SQLite's WAL mode and renders a native commit's journal row into change records
before a reader reads past it, so a reader needs write access. Without it, opening or
settling is FailedPrecondition naming the file and the rule, and nothing is written or
lost: a reader with write access settles the same commits later."""

from __future__ import annotations

import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from cdcflow import Database
from cdcflow.errors import FailedPrecondition
from cdcflow.follow import follow_change_stream
from cdcflow.store.changelog import open_log
from tests.unit.store.test_journal import _counts

pytestmark = pytest.mark.unit


def _with_pending_commit(path: Path) -> tuple[Database, datetime]:
    """A database whose last commit is still in the journal (no reader came yet), and a
    time before that commit."""
    db = Database.open(path)
    db.ddl("CREATE TABLE T (Id INT64 NOT NULL, V INT64) PRIMARY KEY (Id)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    start = db.current_timestamp()
    with db.transaction() as tx:
        tx.insert("T", {"Id": 1, "V": 7})
    return db, start


def _settled_record_values(db: Database, start: datetime) -> list[dict[str, object]]:
    return [m.new_values for r in follow_change_stream(db, "S", start,
                                                       db.current_timestamp()).records
            for m in r.mods]


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


def test_a_file_on_a_read_only_mount_is_failed_precondition_naming_it(tmp_path: Path):
    folder = tmp_path / "data"
    folder.mkdir()
    path = folder / "shop.db"
    db, start = _with_pending_commit(path)
    db.close()
    _mount("--bind", str(folder), str(folder))
    try:
        _mount("-o", "remount,bind,ro", str(folder))
        for opening in (lambda: open_log(str(path)),
                        lambda: Database.open(path, create=False)):
            with pytest.raises(FailedPrecondition, match="write access") as raised:
                opening()
            assert str(path) in str(raised.value)
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)
    assert _counts(path) == (1, 0)  # nothing lost: still in the journal
    assert _settled_record_values(Database.open(path, create=False), start) == [{"V": 7}]
    assert _counts(path) == (0, 1)


def test_a_reader_that_may_not_write_cannot_settle_and_writes_nothing(tmp_path: Path):
    path = tmp_path / "shop.db"
    writer, start = _with_pending_commit(path)
    reader = open_log(str(path))
    conn = reader._session().conn
    conn.execute("PRAGMA query_only = ON")  # SQLite's own read-only connection
    with pytest.raises(FailedPrecondition, match="write access") as raised:
        reader.current_timestamp()
    assert str(path) in str(raised.value)
    assert _counts(path) == (1, 0)
    conn.execute("PRAGMA query_only = OFF")  # write access again: the same commit settles
    reader.current_timestamp()
    assert _counts(path) == (0, 1)
    assert _settled_record_values(writer, start) == [{"V": 7}]
