"""Row-version garbage collection on a large table: the commit that runs a writer's round
(due every 10 s), against the full pass over every version that a round was before (the
baseline, `enforce_retention()`, timed in the same run on a copy of the same file).

A table of --rows rows, each updated once an hour and more ago, so half its versions are
garbage; then commits one clock-tick of 11 s apart, each running a round. Prints the
commit's time with its round (median of --rounds), a plain commit's, the full pass's, and
the ratio round/full (aim: far under 1, and not growing with --rows).
Usage: python bench/bench_version_gc.py [--rows 1000000] [--rounds 9]
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


def timed_commits(path: Path, clock: FakeClock, rounds: int, due: bool) -> list[float]:
    db = Database.open(str(path), clock=clock)
    times = []
    for key in range(rounds):
        if due:
            clock.advance(timedelta(seconds=11))
        began = time.perf_counter()
        with db.transaction() as tx:
            tx.insert_or_update("T", {"Id": key, "V": "again"})
        times.append(time.perf_counter() - began)
    db.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=9)
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
        rounds = statistics.median(timed_commits(path, clock, args.rounds, due=True))
        plain = statistics.median(timed_commits(path, clock, args.rounds, due=False))
    print(f"{args.rows:,} rows, {2 * args.rows:,} versions, {removed:,} of them garbage")
    print(f"  full pass (the baseline, what each round was): {full * 1000:8.1f} ms")
    print(f"  a commit with its round (median):               {rounds * 1000:8.1f} ms")
    print(f"  a commit without one (median):                  {plain * 1000:8.1f} ms")
    print(f"  round/full: {rounds / full:.3f}")


if __name__ == "__main__":
    main()
