"""Change-stream read throughput, records/s, from one process and from two (issue 2).

Usage: python bench/bench_read.py [--transactions 20000] [--partitions 4]
Expected output: records and mods per second for 1 and 2 reader processes.
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from datetime import datetime
from pathlib import Path

from cdcflow import Database, PartitionPolicy


def populate(path: str, transactions: int, partitions: int) -> tuple[datetime, datetime]:
    db = Database.open(path, partition_policy=PartitionPolicy(auto=False),
                       initial_partitions=partitions)
    db.ddl("CREATE TABLE T (Id INT64 NOT NULL, V INT64, S STRING(MAX)) PRIMARY KEY (Id)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    start = db.partitions("S")[0].start_timestamp
    for t in range(transactions):
        with db.transaction() as tx:
            for r in range(4):
                tx.insert_or_update("T", {"Id": (t * 4 + r) % 50_000, "V": t, "S": "payload"})
    return start, db.current_timestamp()


def read_tokens(path: str, tokens: list[str], start: datetime, end: datetime) -> int:
    db = Database.open(path)
    count = 0
    for token in tokens:
        for row in db.read_change_stream("S", start, end, token, 1000):
            if row.data_change_record is not None:
                count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--transactions", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "read.db")
        start, end = populate(path, args.transactions, args.partitions)
        tokens = [p.token for p in Database.open(path).partitions("S")]
        began = time.perf_counter()
        total = read_tokens(path, tokens, start, end)
        one = total / (time.perf_counter() - began)
        context = multiprocessing.get_context("spawn")
        halves = [tokens[0::2], tokens[1::2]]
        with context.Pool(2) as pool:
            began = time.perf_counter()
            counts = pool.starmap(read_tokens, [(path, h, start, end) for h in halves])
            two = sum(counts) / (time.perf_counter() - began)
    print(f"change-stream read, {total} records over {args.partitions} partitions")
    print(f"  1 process : {one:,.0f} records/s")
    print(f"  2 processes: {two:,.0f} records/s (x{two / one:.2f})")


if __name__ == "__main__":
    main()
