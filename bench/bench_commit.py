"""Commit throughput with a change stream on vs off (issue 2; aim: on/off >= 0.85).

Usage: python bench/bench_commit.py [--transactions 2000] [--rows 10]
Expected output: rows/s for each mode and the ratio on/off.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from cdcflow import Database, PartitionPolicy

TABLE = (
    "CREATE TABLE Orders (Id INT64 NOT NULL, Customer STRING(64), Amount INT64, "
    "Note STRING(MAX)) PRIMARY KEY (Id)"
)


def run(folder: Path, stream_on: bool, transactions: int, rows: int) -> float:
    db = Database.open(str(folder / f"bench-{stream_on}.db"),
                       partition_policy=PartitionPolicy(split_records=50_000))
    db.ddl(TABLE)
    if stream_on:
        db.ddl("CREATE CHANGE STREAM S FOR ALL")
    began = time.perf_counter()
    for t in range(transactions):
        with db.transaction() as tx:
            for r in range(rows):
                i = t * rows + r
                tx.insert("Orders", {"Id": i, "Customer": f"c{i % 97}", "Amount": i,
                                     "Note": "x" * 40})
    elapsed = time.perf_counter() - began
    db.close()
    return transactions * rows / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--transactions", type=int, default=2000)
    parser.add_argument("--rows", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        results = {}
        for stream_on in (False, True, False, True):
            rate = run(Path(folder) / str(len(results)), stream_on, args.transactions, args.rows)
            results.setdefault(stream_on, []).append(rate)
    off, on = max(results[False]), max(results[True])
    print(f"commit throughput, {args.transactions} transactions x {args.rows} rows")
    print(f"  change stream off: {off:,.0f} rows/s")
    print(f"  change stream on : {on:,.0f} rows/s")
    print(f"  ratio on/off     : {on / off:.2f} (aim >= 0.85)")


if __name__ == "__main__":
    main()
