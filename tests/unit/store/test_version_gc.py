"""Row-version garbage collection in rounds: a writer's round looks at a bounded number of
versions, on from where the last one stopped, so that a commit that runs one does not take
time in proportion to the tables (a million-row table's full pass took about a second); the
rounds together remove what one full pass removes."""

from __future__ import annotations

import random
import shutil
from collections import Counter
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
    monkeypatch.setattr(retention, "GC_MAX_VERSIONS", 7)
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
    per_key = Counter((t, key) for t in TABLES for key, _, _ in before[t])
    for round_number in range(40):
        clock.advance(timedelta(seconds=11))  # a round is due at each commit
        with db.transaction() as tx:
            tx.insert_or_update("Z", {"Id": round_number, "V": 0})
        now = sum(len(_versions(db, t)) for t in TABLES)
        # 7 versions, and the rest of the last key's
        assert left - now <= 7 + max(per_key.values()), "a round looked at more"
        left = now
    assert {t: _versions(db, t) for t in TABLES} == expected
    assert {t: sorted(map(str, db.scan(t)), key=str) for t in TABLES} == latest
    db.close()


def test_the_budget_grows_while_rounds_find_garbage_and_falls_back_after(
        fake_db: Database, clock: FakeClock, monkeypatch: pytest.MonkeyPatch):
    """Shared by every writer (in meta): doubled after a round that found over a quarter of
    what it looked at to be garbage, so the passes keep up with the writes; halved back to
    the least after rounds that did not."""
    monkeypatch.setattr(retention, "GC_MIN_VERSIONS", 100)
    monkeypatch.setattr(retention, "GC_MAX_VERSIONS", 800)
    db = fake_db
    db.ddl("CREATE TABLE K (Id INT64 NOT NULL, V INT64) PRIMARY KEY (Id)")
    for value in range(3):  # two of each key's three versions become garbage
        with db.transaction() as tx:
            for key in range(2_000):
                tx.insert_or_update("K", {"Id": key, "V": value})
    clock.advance(timedelta(hours=2))
    budgets = []
    for round_number in range(20):
        clock.advance(timedelta(seconds=11))
        with db.transaction() as tx:
            tx.insert_or_update("K", {"Id": 0, "V": 10 + round_number})
        conn = db._session().conn
        (budget,) = conn.execute("SELECT value FROM _meta WHERE key = 'gc_budget'").fetchone()
        budgets.append(int(budget))
    assert budgets[:4] == [200, 400, 800, 800], budgets  # garbage in each round: up to 800
    assert budgets[-1] == 100, budgets  # the garbage is gone: back to the least
    assert len(_versions(db, "K")) == 2_000 + 20  # key 0's versions of the last hour too


def test_a_pass_that_lasts_too_many_rounds_gets_a_larger_budget(
        fake_db: Database, clock: FakeClock, monkeypatch: pytest.MonkeyPatch):
    """No garbage, but a pass that would not end (tables growing as fast as rounds go
    through them) would never reach the tables after: its budget grows too."""
    monkeypatch.setattr(retention, "GC_MIN_VERSIONS", 10)
    monkeypatch.setattr(retention, "GC_MAX_VERSIONS", 80)
    monkeypatch.setattr(retention, "GC_PASS_ROUNDS", 3)
    db = fake_db
    db.ddl("CREATE TABLE K (Id INT64 NOT NULL, V INT64) PRIMARY KEY (Id)")
    with db.transaction() as tx:
        for key in range(400):
            tx.insert("K", {"Id": key, "V": 0})
    budgets, passes = [], []
    for round_number in range(12):
        clock.advance(timedelta(seconds=11))
        with db.transaction() as tx:
            tx.insert("K", {"Id": 1_000 + round_number, "V": 0})
        meta = dict(db._session().conn.execute(
            "SELECT key, value FROM _meta WHERE key IN ('gc_budget', 'gc_pass_rounds')"))
        budgets.append(int(meta["gc_budget"]))
        passes.append(int(meta["gc_pass_rounds"]))
    # the first commit ran round 1; 3 rounds in, each round's budget doubles, up to 80
    assert budgets[:5] == [10, 10, 20, 40, 80], (budgets, passes)
    assert 0 in passes and budgets[-1] < 80, (passes, budgets)  # done, and shrinking back
