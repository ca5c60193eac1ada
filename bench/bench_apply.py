"""CDC table apply cost (issue 4; issue 11, goal 5: apply cost follows the changes).

Usage: python bench/bench_apply.py [--changes 100000] [--sizes 1000000 10000000]
                                   [--layouts rewrite deletion_vectors] [--skip-baselines]
Expected output:
  * apply time of the same-shaped change set into baselines of each size, and the ratio
    largest/smallest, for a CDC-like change set (new keys, updates and deletes of recent keys)
    and for uniformly random keys (the worst case of a range layout), per layout: ranges
    rewritten ("rewrite", the default) or merge-on-read ("deletion_vectors"); aims: CDC-like
    <= 1.5, random <= 2;
  * per layout, the time to read the whole table after the random-key apply, and its ratio to
    reading the rewritten table of the same size, measured in the same run;
  * the same change set through a hand-written delta-rs DeltaTable.merge with manual dedup;
  * a runtime-merge read against a stale (baseline) read.
"""

from __future__ import annotations

import argparse
import random
import shutil
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


def time_apply(folder: Path, size: int, changes: pa.Table,
               layout: str = "rewrite") -> tuple[float, dict, CdcTable]:
    table = CdcTable.create(folder / f"cdc-{size}-{time.time_ns()}", SCHEMA, ["id"],
                            max_staleness=timedelta(hours=1),
                            deletion_vectors=layout == "deletion_vectors")
    table.bulk_load(baseline(size))
    table.connection().append(changes)
    began = time.perf_counter()
    stats = table.apply()
    return time.perf_counter() - began, stats, table


def time_read(table: CdcTable) -> float:
    """The whole table as of its last apply (within max_staleness: no runtime merge)."""
    began = time.perf_counter()
    rows = table.to_arrow().num_rows
    seconds = time.perf_counter() - began
    assert rows > 0
    return seconds


def apply_scaling(folder: Path, sizes: list[int], count: int, layout: str) -> dict[int, float]:
    """Apply times per size, both change sets; returns the random-key read time per size."""
    reads: dict[int, float] = {}
    for random_keys in (False, True):
        label = "uniformly random keys" if random_keys else "CDC-like (recent keys)"
        times = []
        for size in sizes:
            seconds, stats, table = time_apply(folder, size, change_set(size, count, random_keys),
                                               layout)
            times.append(seconds)
            print(f"[{layout}] apply {count:,} changes, {label}, baseline {size:,} rows: "
                  f"{seconds:.2f} s ({stats['files_rewritten']} files rewritten, "
                  f"{stats.get('files_patched', 0)} patched)", flush=True)
            if random_keys:
                reads[size] = time_read(table)
            shutil.rmtree(table.root)
        aim = 2.0 if random_keys else 1.5
        print(f"  [{layout}] {label}: ratio {sizes[-1]:,} / {sizes[0]:,}: "
              f"{times[-1] / times[0]:.2f} (aim <= {aim})", flush=True)
    return reads


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
    parser.add_argument("--layouts", nargs="+", default=["rewrite", "deletion_vectors"])
    parser.add_argument("--skip-baselines", action="store_true",
                        help="skip the delta-rs merge and runtime-merge comparisons")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        reads = {layout: apply_scaling(folder, args.sizes, args.changes, layout)
                 for layout in args.layouts}
        for layout, by_size in reads.items():
            for size, seconds in by_size.items():
                base = reads.get("rewrite", {}).get(size)
                ratio = f", ratio to rewrite {seconds / base:.2f}" if base else ""
                print(f"[{layout}] read {size:,} rows after the random-key apply: "
                      f"{seconds:.2f} s{ratio}")
        if not args.skip_baselines:
            compare_baselines(folder, args.sizes[0], args.changes)


def compare_baselines(folder: Path, size: int, count: int) -> None:
    for random_keys in (False, True):
        changes = change_set(size, count, random_keys)
        ours, _, _ = time_apply(folder, size, changes)
        theirs = time_delta_merge(folder, size, changes)
        label = "random keys" if random_keys else "CDC-like"
        print(f"vs delta-rs merge + manual dedup, {label}, {size:,} rows: cdcflow "
              f"{ours:.2f} s, delta-rs {theirs:.2f} s, ratio {ours / theirs:.2f}")
    stale, merged = time_reads(folder, size, change_set(size, count, False))
    print(f"read {size:,} rows: stale {stale:.2f} s, runtime merge {merged:.2f} s, "
          f"ratio {merged / stale:.2f}")


if __name__ == "__main__":
    main()
