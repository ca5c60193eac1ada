"""The embedded commit path (issue 11 goal 3): 5-row upsert transactions with a change stream
on, against the stream off and against plain Python `sqlite3` doing the same upserts.

Aims: on/off >= 0.85 and on/raw sqlite3 >= 0.30, all three measured in the same run (each
mode twice, alternating; the better run counts). The raw baseline uses the same file settings
as cdcflow (WAL, synchronous=NORMAL) and one transaction per 5 upserts.
Usage: python bench/bench_commit.py [--transactions 4000] [--rows 5] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sqlite3
import tempfile
import time
from pathlib import Path

from cdcflow import Database, PartitionPolicy

TABLE = (
    "CREATE TABLE Orders (Id INT64 NOT NULL, Customer STRING(64), Amount INT64, "
    "Note STRING(MAX)) PRIMARY KEY (Id)"
)
KEYS = 20_000
"""Upserts cycle over this many keys: inserts first, then updates."""


def row(i: int) -> dict[str, object]:
    return {"Id": i % KEYS, "Customer": f"c{i % 97}", "Amount": i, "Note": "x" * 40}


def run_cdcflow(folder: Path, stream_on: bool, transactions: int, rows: int) -> float:
    db = Database.open(str(folder / f"bench-{stream_on}.db"),
                       partition_policy=PartitionPolicy(split_records=50_000))
    db.ddl(TABLE)
    if stream_on:
        db.ddl("CREATE CHANGE STREAM S FOR ALL")
    began = time.perf_counter()
    for t in range(transactions):
        with db.transaction() as tx:
            for r in range(rows):
                tx.insert_or_update("Orders", row(t * rows + r))
    elapsed = time.perf_counter() - began
    db.close()
    return transactions * rows / elapsed


def run_sqlite(folder: Path, transactions: int, rows: int) -> float:
    conn = sqlite3.connect(folder / "raw.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE Orders (Id INTEGER PRIMARY KEY, Customer TEXT, Amount INTEGER, "
                 "Note TEXT)")
    upsert = ("INSERT INTO Orders(Id, Customer, Amount, Note) VALUES (?, ?, ?, ?) "
              "ON CONFLICT(Id) DO UPDATE SET Customer = excluded.Customer, "
              "Amount = excluded.Amount, Note = excluded.Note")
    began = time.perf_counter()
    for t in range(transactions):
        conn.execute("BEGIN IMMEDIATE")
        for r in range(rows):
            values = row(t * rows + r)
            conn.execute(upsert, (values["Id"], values["Customer"], values["Amount"],
                                  values["Note"]))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - began
    conn.close()
    return transactions * rows / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--transactions", type=int, default=4000)
    parser.add_argument("--rows", type=int, default=5)
    parser.add_argument("--profile", action="store_true",
                        help="profile one run with the stream on and print its top entries")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        if args.profile:
            profile = cProfile.Profile()
            profile.runcall(run_cdcflow, Path(folder), True, args.transactions, args.rows)
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)
            return
        results: dict[str, list[float]] = {"off": [], "on": [], "raw": []}
        for attempt in range(2):
            run = Path(folder) / str(attempt)
            run.mkdir()
            results["raw"].append(run_sqlite(run, args.transactions, args.rows))
            results["off"].append(run_cdcflow(run, False, args.transactions, args.rows))
            results["on"].append(run_cdcflow(run, True, args.transactions, args.rows))
    off, on, raw = (max(results[k]) for k in ("off", "on", "raw"))
    print(f"commit path, {args.transactions} transactions x {args.rows} upserts")
    print(f"  plain sqlite3 (baseline): {raw:,.0f} rows/s")
    print(f"  change stream off       : {off:,.0f} rows/s")
    print(f"  change stream on        : {on:,.0f} rows/s")
    print(f"  ratio on/off            : {on / off:.2f} (aim >= 0.85)")
    print(f"  ratio on/sqlite3        : {on / raw:.2f} (aim >= 0.30)")


if __name__ == "__main__":
    main()
