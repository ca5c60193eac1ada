"""A commit that writes a journal row (a watched table's) leaves `_meta` as it was: its row
holds its timestamp and transaction id, `read_meta` takes the newer of the two, and settling
writes them into `_meta` before it removes the row (log format 5). Timestamps still rise
strictly and transaction ids stay unique (CS-7) across journaled commits, unwatched ones,
DDL, settling, reopening and two processes committing at once."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from cdcflow import Database, FakeClock
from cdcflow.errors import FailedPrecondition
from cdcflow.follow import follow_change_stream
from cdcflow.model.timestamps import to_micros
from cdcflow.model.types import COMMIT_TIMESTAMP
from cdcflow.store.sqlite import read_meta
from tests.unit.store.test_change_log_writer import change, transaction

pytestmark = pytest.mark.unit

WATCHED = "CREATE TABLE T (Id INT64 NOT NULL, V INT64) PRIMARY KEY (Id)"
UNWATCHED = ("CREATE TABLE U (Id INT64 NOT NULL, At TIMESTAMP OPTIONS "
             "(allow_commit_timestamp = true)) PRIMARY KEY (Id)")
COMMITS_PER_PROCESS = 40


def _open(path: Path, clock: FakeClock | None = None) -> Database:
    db = Database.open(path, clock=clock)
    if "T" not in db.tables():
        db.ddl(WATCHED)
        db.ddl(UNWATCHED)
        db.ddl("CREATE CHANGE STREAM S FOR T")
    return db


def _stored(path: Path) -> tuple[int, int]:
    """(last commit micros, transaction counter) as `_meta` itself holds them."""
    conn = sqlite3.connect(path)
    try:
        found = dict(conn.execute("SELECT key, value FROM _meta WHERE key IN "
                                  "('last_commit_micros', 'txn_counter')").fetchall())
        return int(found["last_commit_micros"]), int(found["txn_counter"])
    finally:
        conn.close()


def _journal(path: Path) -> list[tuple[int, str]]:
    conn = sqlite3.connect(path)
    try:
        return [(int(m), t) for m, t in conn.execute("SELECT micros, txn FROM _journal")]
    finally:
        conn.close()


def _folded(path: Path) -> tuple[int, int]:
    conn = sqlite3.connect(path)
    try:
        meta = read_meta(conn)
        return int(meta["last_commit_micros"]), int(meta["txn_counter"])
    finally:
        conn.close()


def _commit(db: Database, table: str, key: int) -> int:
    with db.transaction() as tx:
        tx.insert(table, {"Id": key, "V": key} if table == "T" else
                  {"Id": key, "At": COMMIT_TIMESTAMP})
    assert tx.commit_timestamp is not None
    return to_micros(tx.commit_timestamp)


def test_a_journaled_commit_leaves_meta_and_its_journal_row_holds_the_commit(tmp_path: Path):
    """A clock that stands still: every timestamp is the last one's plus one, so a commit
    that took its predecessor's from `_meta` alone would repeat it."""
    path = tmp_path / "j.db"
    db = _open(path, FakeClock())
    before = _stored(path)
    first = _commit(db, "T", 1)
    assert first == before[0] + 1
    assert _stored(path) == before  # `_meta` was not written
    assert _journal(path) == [(first, str(before[1] + 1))]
    assert _folded(path) == (first, before[1] + 1)
    second = _commit(db, "T", 2)
    assert second == first + 1 and _journal(path)[-1] == (second, str(before[1] + 2))
    unwatched = _commit(db, "U", 1)  # no journal row: it writes `_meta` itself
    assert unwatched == second + 1 and _stored(path) == (unwatched, before[1] + 3)
    third = _commit(db, "T", 3)
    assert third == unwatched + 1 and _folded(path) == (third, before[1] + 4)
    db.current_timestamp()  # a reader settles the journal
    assert _journal(path) == [] and _stored(path) == (third, before[1] + 4)
    db.close()
    reopened = _open(path, FakeClock())
    assert _commit(reopened, "T", 4) == third + 1 and _folded(path)[1] == before[1] + 5
    records = follow_change_stream(reopened, "S", reopened.earliest_readable("S"),
                                   reopened.current_timestamp()).records
    ids = [r.server_transaction_id for r in records]
    assert ids == [str(before[1] + n) for n in (1, 2, 4, 5)]
    reopened.close()


def test_an_append_after_a_journaled_commit_takes_the_next_time_and_id(tmp_path: Path):
    """An external source's append allocates its timestamp and id from `_meta` folded with
    the journal, and writes them to `_meta`; DDL settles the journal first."""
    path = tmp_path / "j.db"
    db = _open(path, FakeClock())
    journaled = _commit(db, "T", 1)
    ((_, txn),) = _journal(path)
    appended = to_micros(db.append("pg", transaction(change("INSERT", 10, 1)), None, {"n": 1}))
    assert appended == journaled + 1 and _stored(path) == (appended, int(txn) + 1)
    after = _commit(db, "T", 2)
    assert after == appended + 1 and _journal(path)[-1] == (after, str(int(txn) + 2))
    db.ddl("CREATE TABLE W (Id INT64 NOT NULL) PRIMARY KEY (Id)")
    assert _journal(path) == [] and _stored(path) == (after, int(txn) + 2)
    db.close()


def test_two_handles_on_one_file_take_turns_with_a_still_clock(tmp_path: Path):
    """Each handle's commit follows the other's journaled one: the next time and id."""
    path = tmp_path / "j.db"
    clock = FakeClock()
    first, second = _open(path, clock), Database.open(path, clock=clock)
    times = [_commit(db, "T" if n % 3 else "U", n) for n, db in
             enumerate([first, second] * 6)]
    assert times == list(range(times[0], times[0] + 12))
    records = follow_change_stream(first, "S", first.earliest_readable("S"),
                                   first.current_timestamp()).records
    ids = [int(r.server_transaction_id) for r in records]
    assert len(ids) == 8 and ids == sorted(set(ids))
    first.close()
    second.close()


def _commit_in_a_process(path: str, first_key: int) -> None:
    db = Database.open(path)
    for n in range(COMMITS_PER_PROCESS):
        _commit(db, "T" if n % 2 == 0 else "U", first_key + n)
    db.close()


def test_two_processes_committing_at_once_get_distinct_times_and_ids(tmp_path: Path):
    path = tmp_path / "j.db"
    _open(path).close()
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_commit_in_a_process, args=(str(path), first))
               for first in (0, 10_000)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(120)
        assert writer.exitcode == 0
    db = Database.open(path)
    records = follow_change_stream(db, "S", db.earliest_readable("S"),
                                   db.current_timestamp()).records
    journaled = [(to_micros(r.commit_timestamp), int(r.server_transaction_id))
                 for r in records]
    unwatched = [to_micros(row["At"]) for row in db.scan("U")]
    assert len(journaled) == len(unwatched) == COMMITS_PER_PROCESS
    assert len({micros for micros, _ in journaled} | set(unwatched)) == 2 * COMMITS_PER_PROCESS
    assert len({txn for _, txn in journaled}) == COMMITS_PER_PROCESS
    in_time_order = [txn for _, txn in sorted(journaled)]
    assert in_time_order == sorted(in_time_order)  # ids rise with time (CS-7)
    db.close()


def test_a_file_a_newer_cdcflow_upgraded_under_an_open_handle_is_refused(tmp_path: Path):
    """The format is checked in every write transaction, not only at open: nothing is
    written into a file whose format this cdcflow does not know."""
    path = tmp_path / "j.db"
    db = _open(path, FakeClock())
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE _meta SET value = 99 WHERE key = 'log_format'")
    conn.close()
    with pytest.raises(FailedPrecondition, match="log format 99, newer"):
        _commit(db, "T", 1)
    assert _journal(path) == []
    db.close()
