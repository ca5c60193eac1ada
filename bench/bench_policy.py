"""The partition policy's check as the log grows (CS-5): an append that runs the check
against one that does not, on logs of --sizes records, with the stream at its
`max_partitions` (16), where it splits no more and its partitions only grow.

The check reads each active partition's record count. The counts are kept by every insert
and expiry (`cdcflow.store.log.count_records`); counting the records at each check instead
cost a time that grew with the log. Run it with an older cdcflow on PYTHONPATH to see that.
The baseline is the same append with no check due (the clock moved 1 ms, not 1.1 s), in
the same run; the ratio printed is with/without the check.
Usage: python bench/bench_policy.py [--sizes 200000 1000000 2000000] [--appends 50]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cdcflow import PartitionPolicy
from cdcflow.clock import FakeClock
from cdcflow.model.changes import SourceChange, SourceTransaction
from cdcflow.model.records import ColumnTypeInfo
from cdcflow.model.source import SourceMetadata
from cdcflow.model.types import ColumnType
from cdcflow.store.changelog import ChangeLog

TYPES = (ColumnTypeInfo("id", ColumnType("INT64"), True, 1),
         ColumnTypeInfo("v", ColumnType("INT64"), False, 2))
POLICY = PartitionPolicy(split_records=20_000, max_partitions=16)
BUILD_TRANSACTIONS = 200
"""Transactions of 5 changes per `append_many` while the log is built."""


class Appender:
    """Appends transactions of 5 one-change records to a log, each after the last."""

    def __init__(self, path: Path, clock: FakeClock) -> None:
        self.log = ChangeLog.open(path, clock=clock, partition_policy=POLICY)
        self.log.ensure_change_stream("changes")
        self.clock, self.number, self.position = clock, 0, None

    def append(self, transactions: int) -> None:
        batch = [self._transaction() for _ in range(transactions)]
        following = {"n": self.number}
        self.log.append_many("bench", batch, self.position, following)
        self.position = following

    def _transaction(self) -> SourceTransaction:
        self.number += 1
        metadata = SourceMetadata("postgres-cdc-wal", self.clock.now().astimezone(UTC),
                                  str(self.number), {"commit_lsn": f"0/{self.number:X}"})
        return SourceTransaction(metadata, tuple(
            SourceChange("public.items", "UPDATE", {"id": self.number * 5 + r},
                         {"v": r}, {}, TYPES, position={"lsn": f"0/{self.number:X}"})
            for r in range(5)))


def timed_appends(appender: Appender, appends: int, step: timedelta) -> float:
    """Milliseconds an append of one transaction takes, the clock moved `step` before each."""
    took = 0.0
    for _ in range(appends):
        appender.clock.advance(step)
        began = time.perf_counter()
        appender.append(1)
        took += time.perf_counter() - began
    return took / appends * 1000


def measure(folder: Path, size: int, appends: int) -> tuple[int, float, float]:
    """(active partitions, ms with the check, ms without) on a log of `size` records."""
    clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
    appender = Appender(folder / f"log-{size}.db", clock)
    while appender.number * 5 < size:
        clock.advance(timedelta(milliseconds=200))  # a check now and then, as a capture has
        appender.append(BUILD_TRANSACTIONS)
    checked = timed_appends(appender, appends, timedelta(seconds=1.1))
    unchecked = timed_appends(appender, appends, timedelta(milliseconds=1))
    active = sum(p.end_timestamp is None for p in appender.log.partitions("changes"))
    return active, checked, unchecked


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[200_000, 1_000_000, 2_000_000])
    parser.add_argument("--appends", type=int, default=50)
    args = parser.parse_args()
    print("an append of one 5-change transaction, with the partition policy's check due and "
          "not (the baseline)")
    with tempfile.TemporaryDirectory() as folder:
        for size in args.sizes:
            active, checked, unchecked = measure(Path(folder), size, args.appends)
            print(f"  log of {size:>9,} records, {active} active partitions: with the check "
                  f"{checked:7.2f} ms, without {unchecked:6.2f} ms, "
                  f"ratio {checked / unchecked:6.2f}")


if __name__ == "__main__":
    main()
