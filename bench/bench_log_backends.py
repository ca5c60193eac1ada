"""The two designs of issue 15 for a log that executors on other machines read, measured on
the same entries: sealed segment files on shared storage (chosen) against the log in
PostgreSQL (a networked backend).

A log of --changes upserts (--per-tx rows per transaction, 5 by default, like the latency
benchmarks) is filled in the embedded database; its entries in one partition are then
- sealed: the driver reads them from the SQLite log and writes one Arrow IPC segment per
  --segment-bytes (`seal_slices`), then a task reads every segment and parses each body;
- in PostgreSQL: the same entries are copied into a table keyed (token, micros, seq) on a
  local server (the append a networked log would do, by COPY: its best case), then a task
  selects the range by key and parses each body.
Each side runs --repeat times; the best run is printed. Throughput is entries/s and mods/s;
latency is the time one 1,000-change slice takes from "batch planned" to "parsed on the
executor" (seal + read, or select). The ratios printed are PostgreSQL / segments.

Usage: python bench/bench_log_backends.py [--changes 200000] [--per-tx 5] [--repeat 3]
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import psycopg2

from cdcflow import PartitionPolicy
from cdcflow.model.timestamps import from_micros, to_micros
from cdcflow.spark.options import parse_options
from cdcflow.spark.reading import change_slices, seal_slices, slice_bodies
from cdcflow.store.changelog import open_log
from cdcflow.store.database import Database
from pgkit import start_server


def fill(path: str, changes: int, per_tx: int) -> tuple[int, int]:
    database = Database.open(path, partition_policy=PartitionPolicy(split_records=1 << 40))
    database.ddl("CREATE TABLE Accounts (Id INT64 NOT NULL, Owner STRING(MAX), "
                 "Balance INT64) PRIMARY KEY (Id)")
    database.ddl("CREATE CHANGE STREAM Everything FOR ALL")
    start = to_micros(database.current_timestamp())
    for first in range(0, changes, per_tx):
        with database.transaction() as tx:
            for key in range(first, min(first + per_tx, changes)):
                tx.insert_or_update("Accounts", {"Id": key % 50_000, "Owner": f"o{key % 7}",
                                                 "Balance": key})
    return start, to_micros(database.current_timestamp())


def best(run: Callable[[], int], repeat: int) -> tuple[float, int]:
    times, count = [], 0
    for _ in range(repeat):
        began = time.perf_counter()
        count = run()
        times.append(time.perf_counter() - began)
    return min(times), count


def segments_side(path: str, root: Path, after: int, until: int) -> int:
    """Seal the range (driver), then read and parse every segment (executor): mods."""
    options = parse_options({"database": path, "stream": "Everything",
                             "segmentRoot": str(root / f"run-{time.perf_counter_ns()}")})
    pieces = seal_slices(change_slices(options, open_log(path).partitions("Everything"),
                                       after, until))
    return sum(len(body["mods"]) for piece in pieces for _, _, body in slice_bodies(piece))


def load_postgres(conn: object, entries: list[tuple[str, int, str]], token: str) -> None:
    with conn.cursor() as cursor:  # type: ignore[attr-defined]
        cursor.execute("DROP TABLE IF EXISTS log_entries")
        cursor.execute("CREATE TABLE log_entries (token text, micros bigint, seq int, "
                       "kind text, body text, PRIMARY KEY (token, micros, seq))")
        text = io.StringIO()
        for seq, (kind, micros, body) in enumerate(entries):
            escaped = body.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
            text.write(f"{token}\t{micros}\t{seq}\t{kind}\t{escaped}\n")
        text.seek(0)
        cursor.copy_expert("COPY log_entries FROM STDIN", text)


def postgres_side(conn: object, token: str, after: int, until: int) -> int:
    """Select the range by key (a named cursor, in pages) and parse every body: mods."""
    mods = 0
    with conn.cursor(name=f"read{time.perf_counter_ns()}") as cursor:  # type: ignore[attr-defined]
        cursor.itersize = 5000
        cursor.execute("SELECT kind, micros, body FROM log_entries WHERE token = %s AND "
                       "micros > %s AND micros <= %s ORDER BY micros, seq",
                       (token, after, until))
        for _, _, body in cursor:
            mods += len(orjson.loads(body)["mods"])
    return mods


def measure(folder: Path, args: argparse.Namespace) -> None:
    path = str(folder / "log.db")
    after, until = fill(path, args.changes, args.per_tx)
    log = open_log(path)
    [partition] = log.partitions("Everything")
    entries = list(log.read_log_texts("Everything", partition.token, from_micros(after),
                                      from_micros(until)))
    small_until = entries[min(len(entries), 1000 // args.per_tx) - 1][1]
    server = start_server()
    conn = psycopg2.connect(server.dsn(), password=server.password)
    conn.autocommit = False
    try:
        load_seconds, _ = best(lambda: load_postgres(conn, entries, partition.token) or 0, 1)
        conn.commit()
        results = {
            "segments": best(lambda: segments_side(path, folder, after, until), args.repeat),
            "postgres": best(lambda: postgres_side(conn, partition.token, after, until),
                             args.repeat),
            "segments 1k": best(lambda: segments_side(path, folder, after, small_until),
                                args.repeat),
            "postgres 1k": best(lambda: postgres_side(conn, partition.token, after,
                                                      small_until), args.repeat)}
    finally:
        conn.close()
        server.stop()
    print(f"{len(entries):,} log entries, {args.changes:,} mods ({args.per_tx} per "
          f"transaction), one partition; best of {args.repeat}")
    for side in ("segments", "postgres"):
        seconds, mods = results[side]
        print(f"  {side:<9}: {len(entries) / seconds:9,.0f} entries/s, {mods / seconds:9,.0f} "
              f"mods/s; a 1,000-change slice {results[side + ' 1k'][0] * 1000:6.1f} ms")
    print(f"  ratio postgres / segments: throughput "
          f"{results['segments'][0] / results['postgres'][0]:.2f}, 1,000-change slice "
          f"{results['postgres 1k'][0] / results['segments 1k'][0]:.2f} (time)")
    print(f"  the copy into PostgreSQL (its append, best case): "
          f"{len(entries) / load_seconds:,.0f} entries/s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--per-tx", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        measure(Path(folder), args)


if __name__ == "__main__":
    main()
