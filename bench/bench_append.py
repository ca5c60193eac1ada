"""The change-log writer: source transactions appended per second (the path every external
source's capture worker takes), against the embedded database committing the same rows.

Usage: python bench/bench_append.py [--transactions 4000] [--rows 5]
Expected output: rows/s for `append` and for native commits, and the ratio append/native.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from cdcflow import Database, PartitionPolicy
from cdcflow.model.changes import SourceChange, SourceTransaction
from cdcflow.model.records import ColumnTypeInfo
from cdcflow.model.source import SourceMetadata
from cdcflow.model.types import ColumnType
from cdcflow.store.changelog import ChangeLog

TYPES = (ColumnTypeInfo("Id", ColumnType("INT64"), True, 1),
         ColumnTypeInfo("Customer", ColumnType("STRING"), False, 2),
         ColumnTypeInfo("Amount", ColumnType("INT64"), False, 3))
POLICY = PartitionPolicy(split_records=50_000)


def appended(folder: Path, transactions: int, rows: int) -> float:
    log = ChangeLog.open(folder / "append.log", partition_policy=POLICY)
    log.ensure_change_stream("changes")
    now = datetime.now(UTC)
    position = None
    began = time.perf_counter()
    for t in range(transactions):
        changes = tuple(SourceChange("public.orders", "INSERT", {"Id": t * rows + r},
                                     {"Customer": f"c{r}", "Amount": r}, {}, TYPES,
                                     position={"lsn": f"0/{t * rows + r:X}"})
                        for r in range(rows))
        following = {"lsn": f"0/{(t + 1) * rows:X}"}
        log.append("bench", SourceTransaction(SourceMetadata("postgres-cdc-wal", now, str(t)),
                                              changes), position, following)
        position = following
    return transactions * rows / (time.perf_counter() - began)


def native(folder: Path, transactions: int, rows: int) -> float:
    db = Database.open(folder / "native.db", partition_policy=POLICY)
    db.ddl("CREATE TABLE Orders (Id INT64 NOT NULL, Customer STRING(64), Amount INT64) "
           "PRIMARY KEY (Id)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    began = time.perf_counter()
    for t in range(transactions):
        with db.transaction() as tx:
            for r in range(rows):
                tx.insert("Orders", {"Id": t * rows + r, "Customer": f"c{r}", "Amount": r})
    return transactions * rows / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--transactions", type=int, default=4000)
    parser.add_argument("--rows", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        append_rate = appended(folder, args.transactions, args.rows)
        native_rate = native(folder, args.transactions, args.rows)
    print(f"append: {append_rate:,.0f} rows/s ({args.transactions} transactions of "
          f"{args.rows} rows)")
    print(f"native commits (baseline): {native_rate:,.0f} rows/s")
    print(f"ratio append/native: {append_rate / native_rate:.2f}")


if __name__ == "__main__":
    main()
