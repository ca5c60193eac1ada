"""Row-version garbage collection in rounds: a writer's round looks at a bounded number of
versions, on from where the last one stopped, so that a commit that runs one does not take
time in proportion to the tables (a million-row table's full pass took about a second); the
rounds together remove what one full pass removes."""

from __future__ import annotations

import random
import shutil
from datetime import timedelta
from pathlib import Path

import pytest

from cdcflow import Database, FakeClock
from cdcflow.store import retention

pytestmark = pytest.mark.unit

TABLES = ("K", "L")


def _versions(db: Database, table: str) -> set[tuple[str, int, int]]:
    session = db._session()
    storage = session.catalog.storage(table)
    return set(session.conn.execute(f"SELECT key, commit_micros, deleted FROM {storage}"))


def _history(db: Database, seed: int) -> None:
    """Random upserts and deletes of 30 keys in two tables: several versions a key, some
    keys deleted (tombstones), some written again after their deletion."""
    rng = random.Random(seed)
    for _ in range(60):
        with db.transaction() as tx:
            for table in rng.sample(TABLES, rng.randint(1, 2)):
                key = rng.randrange(30)
                if rng.random() < 0.2 and db.read_row(table, key) is not None:
                    tx.delete(table, {"Id": key})
                else:
                    tx.insert_or_update(table, {"Id": key, "V": rng.randrange(1000)})


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rounds_of_a_bounded_size_remove_what_one_full_pass_removes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int):
    monkeypatch.setattr(retention, "GC_MIN_VERSIONS", 7)
    monkeypatch.setattr(retention, "GC_VERSIONS_PER_WRITE", 0)
    clock = FakeClock()
    db = Database.open(str(tmp_path / "rounds.db"), clock=clock)
    for table in (*TABLES, "Z"):
        db.ddl(f"CREATE TABLE {table} (Id INT64 NOT NULL, V INT64) PRIMARY KEY (Id)")
    _history(db, seed)
    before = {t: _versions(db, t) for t in TABLES}
    latest = {t: sorted(map(str, db.scan(t)), key=str) for t in TABLES}
    clock.advance(timedelta(hours=2))
    db.close()
    shutil.copy(tmp_path / "rounds.db", tmp_path / "full.db")
    full = Database.open(str(tmp_path / "full.db"), clock=clock)
    full.enforce_retention()  # one full pass
    expected = {t: _versions(full, t) for t in TABLES}
    full.close()
    assert all(expected[t] < before[t] for t in TABLES), "no garbage to collect"
    db = Database.open(str(tmp_path / "rounds.db"), clock=clock)
    left = sum(len(v) for v in before.values())
    for round_number in range(40):
        clock.advance(timedelta(seconds=11))  # a round is due at each commit
        with db.transaction() as tx:
            tx.insert_or_update("Z", {"Id": round_number, "V": 0})
        now = sum(len(_versions(db, t)) for t in TABLES)
        assert left - now <= 7, "a round removed more than it may look at"
        left = now
    assert {t: _versions(db, t) for t in TABLES} == expected
    assert {t: sorted(map(str, db.scan(t)), key=str) for t in TABLES} == latest
    db.close()


def test_a_round_looks_at_more_versions_when_more_were_written(
        fake_db: Database, clock: FakeClock, monkeypatch: pytest.MonkeyPatch):
    """The budget follows the writes since the last round, so the passes keep up."""
    seen: list[int] = []
    original = retention.expire_row_versions

    def noted(conn, catalog, now_micros, budget=None):  # type: ignore[no-untyped-def]
        seen.append(budget)
        return original(conn, catalog, now_micros, budget)

    monkeypatch.setattr(retention, "expire_row_versions", noted)
    db = fake_db
    db.ddl("CREATE TABLE K (Id INT64 NOT NULL, V INT64) PRIMARY KEY (Id)")
    for writes in (10, 10_000):
        for first in range(0, writes, 1000):
            with db.transaction() as tx:
                for key in range(first, min(first + 1000, writes)):
                    tx.insert_or_update("K", {"Id": key, "V": writes})
        clock.advance(timedelta(seconds=11))
        with db.transaction() as tx:
            tx.insert_or_update("K", {"Id": 0, "V": 0})
    assert seen[-2] == retention.GC_MIN_VERSIONS
    assert seen[-1] >= retention.GC_VERSIONS_PER_WRITE * 10_000 > retention.GC_MIN_VERSIONS
