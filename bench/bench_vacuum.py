"""Disk use of a CDC table under applies, with and without a vacuum (cdcflow.table.vacuum).

A table of --rows rows in ranges of --range-rows takes --applies applies of --changes upserts
of uniformly random keys (every apply rewrites the ranges it touches, or their patches with
--layout deletion_vectors). Printed: the folder's size after the load, after the applies
(the baseline: what stays on disk without a vacuum), and after one vacuum that keeps only
what the newest version reads (retention 0, as if the retention had passed), with its ratio
to the baseline and the vacuum's own time.
Usage: python bench/bench_vacuum.py [--rows 200000] [--range-rows 50000] [--applies 40]
                                    [--changes 2000] [--layout rewrite|deletion_vectors]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import pyarrow as pa

from cdcflow.table import CdcTable


def folder_size(root: Path) -> int:
    return sum(path.stat().st_size for path in root.rglob("*") if path.is_file())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--range-rows", type=int, default=50_000)
    parser.add_argument("--applies", type=int, default=40)
    parser.add_argument("--changes", type=int, default=2_000)
    parser.add_argument("--layout", choices=["rewrite", "deletion_vectors"], default="rewrite")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        table = CdcTable.create(Path(folder) / "t", "id INT64 NOT NULL, v INT64, note "
                                "STRING(MAX)", ["id"], target_file_rows=args.range_rows,
                                deletion_vectors=args.layout == "deletion_vectors")
        table.bulk_load(pa.table({"id": pa.array(range(args.rows), pa.int64()),
                                  "v": pa.array([0] * args.rows, pa.int64()),
                                  "note": pa.array([f"note {i}" for i in range(args.rows)])}))
        loaded = folder_size(table.root)
        rng = random.Random(1)
        for number in range(args.applies):
            table.connection().append([
                {"id": rng.randrange(args.rows), "v": number, "note": f"changed {number}",
                 "_CHANGE_TYPE": "UPSERT"} for _ in range(args.changes)])
            table.apply()
        grown = folder_size(table.root)
        began = time.perf_counter()
        done = table.vacuum(timedelta(0), enforce_retention=False)
        seconds = time.perf_counter() - began
        after = folder_size(table.root)
    print(f"{args.rows:,} rows in ranges of {args.range_rows:,}, layout {args.layout}; "
          f"{args.applies} applies of {args.changes:,} random-key upserts")
    print(f"  folder after the load        : {loaded / 1e6:8.1f} MB")
    print(f"  after the applies (baseline) : {grown / 1e6:8.1f} MB")
    print(f"  after one vacuum             : {after / 1e6:8.1f} MB, ratio to the baseline "
          f"{after / grown:.3f} ({len(done.files):,} files, {done.bytes / 1e6:.1f} MB deleted "
          f"in {seconds:.2f} s)")


if __name__ == "__main__":
    main()
