"""CDC table apply cost (issue 4).

Usage: python bench/bench_apply.py [--changes 100000] [--sizes 1000000 10000000]
Expected output:
  * apply time of the same-shaped change set into baselines of each size, and the ratio
    largest/smallest, for a CDC-like change set (new keys, updates and deletes of recent keys)
    and for uniformly random keys (the worst case of a range layout);
  * the same change set through a hand-written delta-rs DeltaTable.merge with manual dedup;
  * a runtime-merge read against a stale (baseline) read.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from cdcflow.table import CdcTable

SCHEMA = "id INT64 NOT NULL, name STRING(MAX), salary INT64"


def baseline(size: int) -> pa.Table:
    return pa.table({"id": pa.array(range(size), pa.int64()),
                     "name": pa.array([f"name-{i % 1000}" for i in range(size)]),
                     "salary": pa.array(range(size), pa.int64())})


def change_set(size: int, count: int, random_keys: bool, seed: int = 7) -> pa.Table:
    rng = random.Random(seed)
    ids, kinds, names = [], [], []
    recent = max(1, min(size, 200_000))
    for n in range(count):
        if random_keys:
            key, kind = rng.randrange(size), "DELETE" if rng.random() < 0.1 else "UPSERT"
        elif n % 10 < 5:
            key, kind = size + n, "UPSERT"
        elif n % 10 < 9:
            key, kind = size - 1 - rng.randrange(recent), "UPSERT"
        else:
            key, kind = size - 1 - rng.randrange(recent), "DELETE"
        ids.append(key)
        kinds.append(kind)
        names.append(f"changed-{n}")
    return pa.table({"id": pa.array(ids, pa.int64()), "name": names,
                     "salary": pa.array(range(count), pa.int64()), "_CHANGE_TYPE": kinds,
                     "_CHANGE_SEQUENCE_NUMBER": [f"{n + 1:x}" for n in range(count)]})


def time_apply(folder: Path, size: int, changes: pa.Table) -> tuple[float, dict]:
    table = CdcTable.create(folder / f"cdc-{size}-{time.time_ns()}", SCHEMA, ["id"])
    table.bulk_load(baseline(size))
    table.connection().append(changes)
    began = time.perf_counter()
    stats = table.apply()
    return time.perf_counter() - began, stats


def time_delta_merge(folder: Path, size: int, changes: pa.Table) -> float:
    path = str(folder / f"plain-{size}-{time.time_ns()}")
    write_deltalake(path, baseline(size))
    began = time.perf_counter()
    order = pc.sort_indices(changes, [("id", "ascending"),
                                      ("_CHANGE_SEQUENCE_NUMBER", "ascending")])
    ordered = changes.take(order)
    ids = ordered.column("id").to_pylist()
    last = [i for i in range(len(ids)) if i + 1 == len(ids) or ids[i + 1] != ids[i]]
    latest = ordered.take(pa.array(last))
    (DeltaTable(path).merge(latest, predicate="t.id = s.id", source_alias="s",
                            target_alias="t")
     .when_matched_delete(predicate="s._CHANGE_TYPE = 'DELETE'")
     .when_matched_update(updates={"name": "s.name", "salary": "s.salary"},
                          predicate="s._CHANGE_TYPE = 'UPSERT'")
     .when_not_matched_insert(updates={"id": "s.id", "name": "s.name", "salary": "s.salary"},
                              predicate="s._CHANGE_TYPE = 'UPSERT'")
     .execute())
    return time.perf_counter() - began


def time_reads(folder: Path, size: int, changes: pa.Table) -> tuple[float, float]:
    table = CdcTable.create(folder / f"reads-{size}", SCHEMA, ["id"],
                            max_staleness=timedelta(hours=1))
    table.bulk_load(baseline(size))
    table.connection().append(changes)
    began = time.perf_counter()
    stale = table.to_arrow()
    stale_seconds = time.perf_counter() - began
    table.alter(max_staleness=timedelta(microseconds=1))
    began = time.perf_counter()
    merged = table.to_arrow()
    merged_seconds = time.perf_counter() - began
    assert stale.num_rows == size and merged.num_rows != size
    return stale_seconds, merged_seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--changes", type=int, default=100_000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        for random_keys in (False, True):
            label = "uniformly random keys" if random_keys else "CDC-like (recent keys)"
            times = []
            for size in args.sizes:
                seconds, stats = time_apply(folder, size, change_set(size, args.changes,
                                                                     random_keys))
                times.append(seconds)
                print(f"apply {args.changes:,} changes, {label}, baseline {size:,} rows: "
                      f"{seconds:.2f} s ({stats['files_rewritten']} files rewritten)")
            print(f"  ratio {args.sizes[-1]:,} / {args.sizes[0]:,}: {times[-1] / times[0]:.2f}"
                  " (aim <= 1.5)")
        size = args.sizes[0]
        for random_keys in (False, True):
            changes = change_set(size, args.changes, random_keys)
            ours, _ = time_apply(folder, size, changes)
            theirs = time_delta_merge(folder, size, changes)
            label = "random keys" if random_keys else "CDC-like"
            print(f"vs delta-rs merge + manual dedup, {label}, {size:,} rows: cdcflow "
                  f"{ours:.2f} s, delta-rs {theirs:.2f} s, ratio {ours / theirs:.2f}")
        stale, merged = time_reads(folder, size, change_set(size, args.changes, False))
        print(f"read {size:,} rows: stale {stale:.2f} s, runtime merge {merged:.2f} s, "
              f"ratio {merged / stale:.2f}")


if __name__ == "__main__":
    main()
