"""Row-version garbage collection on a large table: the commit that runs a writer's round
(due every 10 s), against the full pass over every version that a round was before (the
baseline, `enforce_retention()`, timed in the same run on a copy of the same file).

A table of --rows rows, each updated once an hour and more ago, so half its versions are
garbage; then --rounds commits one clock-tick of 11 s apart, each running a round. Prints
each round's commit time with the budget it had (the budget doubles while rounds find
garbage this dense), a plain commit's time, the full pass's, and the ratios of the first
(least) and the largest round to the full pass (aim: far under 1, and not growing with
--rows).
Usage: python bench/bench_version_gc.py [--rows 1000000] [--rounds 6]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from cdcflow import Database, FakeClock

TABLE = "CREATE TABLE T (Id INT64 NOT NULL, V STRING(MAX)) PRIMARY KEY (Id)"


def fill(path: Path, rows: int, clock: FakeClock) -> None:
    db = Database.open(str(path), clock=clock)
    db.ddl(TABLE)
    for value in ("first", "second"):
        for start in range(0, rows, 10_000):
            with db.transaction() as tx:
                for key in range(start, min(start + 10_000, rows)):
                    tx.insert_or_update("T", {"Id": key, "V": value * 8})
        clock.advance(timedelta(seconds=11))  # each filling pass runs its round
    clock.advance(timedelta(hours=2))
    db.close()


def timed_commits(path: Path, clock: FakeClock, rounds: int, due: bool
                  ) -> list[tuple[float, int]]:
    """(seconds, the round's budget) of each commit."""
    db = Database.open(str(path), clock=clock)
    times = []
    for key in range(rounds):
        if due:
            clock.advance(timedelta(seconds=11))
        budget = db._session().conn.execute(
            "SELECT value FROM _meta WHERE key = 'gc_budget'").fetchone()
        began = time.perf_counter()
        with db.transaction() as tx:
            tx.insert_or_update("T", {"Id": key, "V": "again"})
        times.append((time.perf_counter() - began, int(budget[0]) if budget else 20_000))
    db.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path, copy = Path(folder) / "gc.db", Path(folder) / "full.db"
        clock = FakeClock()
        fill(path, args.rows, clock)
        shutil.copy(path, copy)
        full_db = Database.open(str(copy), clock=clock)
        began = time.perf_counter()
        removed = full_db.enforce_retention()["row_versions"]
        full = time.perf_counter() - began
        full_db.close()
        rounds = timed_commits(path, clock, args.rounds, due=True)
        plain = statistics.median(t for t, _ in timed_commits(path, clock, 9, due=False))
    print(f"{args.rows:,} rows, {2 * args.rows:,} versions, {removed:,} of them garbage")
    print(f"  full pass (the baseline, what each round was): {full * 1000:8.1f} ms")
    for seconds, budget in rounds:
        print(f"  a commit with its round of {budget:>7,} versions:  {seconds * 1000:8.1f} ms")
    print(f"  a commit without one (median):                  {plain * 1000:8.1f} ms")
    largest = max(t for t, _ in rounds)
    print(f"  first round/full: {rounds[0][0] / full:.3f}; largest round/full: "
          f"{largest / full:.3f}")


if __name__ == "__main__":
    main()
