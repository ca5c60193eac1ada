"""The commit journal (CS-1, `cdcflow.store.journal`): a native commit writes one journal row
with its data; readers settle it into change records before they read, and never read past
a commit still in it; a writer bounds it when no reader comes; a process killed while
settling leaves whole batches settled, the oldest first, and the rest in the journal."""

from __future__ import annotations

import json
import multiprocessing
import random
import shutil
import sqlite3
import time
from datetime import timedelta
from pathlib import Path

import pytest

from cdcflow import Database, FakeClock, PartitionPolicy
from cdcflow.follow import follow_change_stream
from cdcflow.model.timestamps import to_micros
from cdcflow.store import journal, log
from cdcflow.store.capture import RowChange

pytestmark = pytest.mark.unit

ROWS_PER_COMMIT = 20
TABLE = "CREATE TABLE T (Id INT64 NOT NULL, V INT64, J JSON) PRIMARY KEY (Id)"


def _counts(path: Path) -> tuple[int, int]:
    """(journal rows, data records in the log)."""
    conn = sqlite3.connect(path)
    try:
        (pending,) = conn.execute("SELECT COUNT(*) FROM _journal").fetchone()
        (records,) = conn.execute("SELECT COUNT(*) FROM _log WHERE kind = 0").fetchone()
        return int(pending), int(records)
    finally:
        conn.close()


def _open(path: Path, clock: FakeClock | None = None, **policy: object) -> Database:
    db = Database.open(path, clock=clock, partition_policy=PartitionPolicy(**policy))  # type: ignore[arg-type]
    db.ddl(TABLE)
    return db


def test_a_commit_writes_its_journal_row_and_a_reader_settles_it(tmp_path: Path):
    path = tmp_path / "j.db"
    db = _open(path)
    with db.transaction() as tx:
        tx.insert("T", {"Id": 1, "V": 1})
    assert _counts(path) == (0, 0)  # no stream watches T: nothing to record
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    start = db.current_timestamp()
    with db.transaction() as tx:
        tx.insert("T", {"Id": 2, "V": 2})
        tx.update("T", {"Id": 1, "V": 5})
    assert _counts(path) == (1, 0)
    records = follow_change_stream(db, "S", start, db.current_timestamp()).records
    assert sorted((r.mod_type, m.keys["Id"]) for r in records for m in r.mods) == [
        ("INSERT", 2), ("UPDATE", 1)]
    assert _counts(path) == (0, 2)


def test_a_reader_never_reads_past_a_commit_still_in_the_journal(tmp_path: Path):
    path = tmp_path / "j.db"
    db = _open(path)
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    with db.transaction() as tx:
        tx.insert("T", {"Id": 1})
    first = to_micros(db.current_timestamp())
    committed = db.transaction()
    committed.insert("T", {"Id": 2})
    second = to_micros(committed.commit())
    conn = sqlite3.connect(path)
    try:
        assert journal.first_pending(conn) == second
        assert journal.readable_micros(conn, second + 10) == second - 1
        assert journal.read_bound(conn, None) == second - 1
        assert journal.read_bound(conn, first) == first
    finally:
        conn.close()
    assert to_micros(db.current_timestamp()) >= second  # settled first, then read
    assert _counts(path) == (0, 2)


def test_admission_counts_up_to_a_pending_commit_settle_it_first(tmp_path: Path):
    path = tmp_path / "j.db"
    db = _open(path)
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    start = db.current_timestamp()
    with db.transaction() as tx:
        for key in range(3):
            tx.insert("T", {"Id": key})
    until = db.transaction()
    until.insert("T", {"Id": 9})
    at = until.commit()
    tokens = [p.token for p in db.partitions("S")]
    bound, counts = db.log_admission_counts("S", tokens, start, at, 100)
    assert bound == to_micros(at) and sum(n for _, n in counts) == 4
    assert _counts(path)[0] == 0


def test_values_beyond_64_bits_in_a_json_column_survive_the_journal(tmp_path: Path):
    db = _open(tmp_path / "j.db")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    start = db.current_timestamp()
    big = {"n": 2**70, "m": -(2**80)}
    with db.transaction() as tx:
        tx.insert("T", {"Id": 1, "J": big})
    (record,) = follow_change_stream(db, "S", start, db.current_timestamp()).records
    assert db.read_row("T", 1)["J"] == big
    assert '"n":1180591620717411303424' in record.mods[0].new_values["J"].replace(" ", "")


def test_an_integer_beyond_64_bits_in_a_row_is_journaled_exactly(tmp_path: Path):
    """orjson refuses such an integer; the standard encoder writes it, as rows do."""
    db = _open(tmp_path / "j.db")
    conn = sqlite3.connect(":memory:")
    log.create_tables(conn)
    before = {"Id": 1, "V": None, "J": 2**70}
    after = {"Id": 1, "V": 3, "J": -(2**80)}
    change = RowChange(db.table_schema("T"), "[1]", 7, before, after, {"V"})
    journal.write_entry(conn, 10, "1", [change], [json.dumps(after)])
    (text,) = conn.execute("SELECT changes FROM _journal").fetchone()
    assert json.loads(text) == [["T", "[1]", 7, before, after, ["V"]]]
    decoded = journal._decode(text)[0]
    assert (decoded[3]["J"], decoded[4]["J"]) == (2**70, -(2**80))  # exact, not floats


def test_a_writer_settles_a_journal_no_reader_settles(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(journal, "SETTLE_BACKLOG", 5)
    clock = FakeClock()
    path = tmp_path / "j.db"
    db = _open(path, clock, check_interval_seconds=1.0)
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    for key in range(8):
        clock.advance(timedelta(milliseconds=100))
        with db.transaction() as tx:
            tx.insert("T", {"Id": key})
    assert _counts(path)[0] == 8  # within the policy's check interval: nothing settled
    clock.advance(timedelta(seconds=2))
    with db.transaction() as tx:
        tx.insert("T", {"Id": 100})
    assert _counts(path) == (0, 9)


def _settle_in_a_process(path: str, ready: multiprocessing.Event) -> None:  # type: ignore[valid-type]
    db = Database.open(path, create=False)
    ready.set()  # type: ignore[attr-defined]
    db.current_timestamp()


def _pending_file(tmp_path: Path, commits: int) -> Path:
    path = tmp_path / "pristine.db"
    db = _open(path, auto=False)  # no policy check settles the journal on the way
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    for number in range(commits):
        with db.transaction() as tx:
            for row in range(ROWS_PER_COMMIT):
                tx.insert_or_update("T", {"Id": (number * ROWS_PER_COMMIT + row) % 5_000,
                                          "V": number})
    db.close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return path


def _log_rows(path: Path) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT commit_micros, seq, kind, mods, body FROM _log "
                            "ORDER BY commit_micros, seq").fetchall()
    finally:
        conn.close()


def test_a_process_killed_while_settling_leaves_whole_batches_settled(tmp_path: Path):
    """Kill points drawn over about one and a half times a settle's length."""
    commits = 2_000
    pristine = _pending_file(tmp_path, commits)
    assert _counts(pristine) == (commits, 0)
    reference = tmp_path / "reference.db"
    shutil.copy(pristine, reference)
    began = time.perf_counter()
    Database.open(reference, create=False).current_timestamp()
    settle_seconds = time.perf_counter() - began
    expected = _log_rows(reference)
    times = sorted({row[0] for row in expected})
    assert len(times) == commits  # every commit has records
    context = multiprocessing.get_context("spawn")
    for attempt in range(8):
        work = tmp_path / f"work-{attempt}.db"
        shutil.copy(pristine, work)
        ready = context.Event()
        process = context.Process(target=_settle_in_a_process, args=(str(work), ready))
        process.start()
        assert ready.wait(60)
        process.join(random.uniform(0.0, 1.5 * settle_seconds))  # a kill point
        process.kill()
        process.join()
        settled = commits - _counts(work)[0]
        assert settled % (journal.SETTLE_CHANGES // ROWS_PER_COMMIT) == 0 \
            or settled == commits  # whole batches
        cut = times[settled - 1] if settled else -1
        assert _log_rows(work) == [row for row in expected if row[0] <= cut]  # oldest first
        Database.open(work, create=False).current_timestamp()
        assert _log_rows(work) == expected
