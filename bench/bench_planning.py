"""Planning time per micro-batch against the length of the partition lineage (issue 11 goal 4:
it must not grow with the number of finished partitions).

For lineages of 0 to a few thousand finished partitions (split and merge cycles), times the
streaming reader's planning of one batch (`latestOffset` then `partitions`, no JVM) and, as
the baseline in the same run, the same plan made from every partition of the lineage, which
is what the reader did before it asked for the live ones only.
Usage: python bench/bench_planning.py [--cycles 0 250 1000] [--repeat 200]
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cdcflow import Database, PartitionPolicy
from cdcflow.model.timestamps import to_micros
from cdcflow.spark.offsets import StreamOffset, batch_end, frontier_at
from cdcflow.spark.options import parse_options
from cdcflow.spark.source import ChangeStreamReader, _slices


def lineage(path: Path, cycles: int) -> Database:
    """Two active partitions after `cycles` split-and-merge rounds (3 finished per round)."""
    db = Database.open(path, partition_policy=PartitionPolicy(auto=False))
    db.ddl("CREATE TABLE K (Id INT64 NOT NULL, V INT64) PRIMARY KEY (Id)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    (root,) = db.partitions("S")
    low, _ = db.split_partition("S", root.token)
    for _ in range(cycles):
        a, b = db.split_partition("S", low)
        low = db.merge_partitions("S", [a, b])
    with db.transaction() as tx:
        tx.insert_or_update("K", {"Id": 1, "V": 1})
    return db


def whole_lineage_plan(db: Database, begin: int, safe: int) -> int:
    everything = db.partitions("S")
    options = parse_options({"database": db.path, "stream": "S"})
    offset = StreamOffset(begin, frontier_at(everything, begin))
    end = batch_end(everything, offset, safe)
    frontier_at(everything, end)
    return len(_slices(options, everything, begin, end))


def live_plan(reader: ChangeStreamReader, start: dict) -> int:
    end = reader.latestOffset(start, None)
    return len(reader.partitions(start, end))


def per_call_ms(call: Callable[[], object], repeat: int) -> float:
    began = time.perf_counter()
    for _ in range(repeat):
        call()
    return (time.perf_counter() - began) / repeat * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, nargs="+", default=[0, 250, 1000])
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    print("planning one batch (latestOffset + partitions), ms per batch")
    with tempfile.TemporaryDirectory() as folder:
        for cycles in args.cycles:
            db = lineage(Path(folder) / f"l{cycles}.db", cycles)
            finished = sum(1 for p in db.partitions("S") if p.end_timestamp is not None)
            safe = to_micros(db.current_timestamp())
            begin = safe - 1
            reader = ChangeStreamReader(parse_options(
                {"database": db.path, "stream": "S", "startingTimestamp": "earliest"}), db)
            start = reader._offset_at(begin).to_dict()
            assert live_plan(reader, start) == whole_lineage_plan(db, begin, safe)
            live = per_call_ms(functools.partial(live_plan, reader, start), args.repeat)
            whole = per_call_ms(functools.partial(whole_lineage_plan, db, begin, safe),
                                args.repeat)
            print(f"  {finished:5d} finished partitions: live {live:6.2f} ms, whole lineage "
                  f"(baseline) {whole:6.2f} ms, ratio {live / whole:.2f}")


if __name__ == "__main__":
    main()
