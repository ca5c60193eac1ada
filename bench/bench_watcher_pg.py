"""The polling change watcher on PostgreSQL (issue 13; seed 001's CW-8 in PostgreSQL terms).

A real server is started for the run (as bench/bench_pg_* do). The table is made watchable
by `prepare_table`: a stamp trigger, a generated shard column (19 shards, CW-3) and the
partial index on (shard, ts) (CW-4).
  1. Detection: a backlog of --rows upserts (100 per commit) is written, then the watcher
     reads it into its change log. Mutations detected per second, for three layouts: the
     partial (shard, ts) index polled with shard IN (-18..18); a partial index on ts alone;
     no index (each poll scans). Baseline: the writer's own rate (mutations committed per
     second, same server, same run), and the seed's reference of 3,000-5,000/s per table
     (CW-8). Goal: >= 10,000/s.
  2. Poll latency at a steady --rate writes/s (20 rows per commit) for --seconds: from each
     row's timestamp (its transaction's start) to its append to the watcher's log; p50, p99.
  3. Index size after --index-rows inserts: live entries and bytes of the partial index;
     then after a cleanup of the rows older than the last 10% and a VACUUM; then after a
     REINDEX (PostgreSQL does not give index pages back without one).
Usage: python bench/bench_watcher_pg.py [--rows 100000] [--rate 2000] [--seconds 20]
       [--index-rows 1000000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg2
from psycopg2 import sql

from bench_watcher import append_lags, detection_rate
from cdcflow.capture.watcher.config import PostgresTargetConfig, WatchedTable, WatcherConfig
from cdcflow.capture.watcher.pg_schema import prepare_table
from cdcflow.capture.watcher.source import WatcherSource
from cdcflow.localdb import LocalPostgres
from cdcflow.model.timestamps import to_micros
from cdcflow.store.changelog import ChangeLog

ENV = "CDCFLOW_BENCH_PG_PASSWORD"
LAYOUTS = {"shard index": True, "timestamp index": False, "no index": None}


def connect(pg: LocalPostgres) -> Any:
    conn = psycopg2.connect(pg.dsn(), password=pg.password)
    conn.autocommit = True
    return conn


def make_table(pg: LocalPostgres, name: str, sharded: bool | None) -> None:
    """public.<name> (id, first, last), prepared; `sharded` None drops the index after."""
    conn = connect(pg)
    with conn.cursor() as cur:
        cur.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(sql.Identifier(name)))
        cur.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, first text, last text)"
                            ).format(sql.Identifier(name)))
    options: dict[str, Any] = {"shard_column": "shard", "shards": 19} if sharded else {}
    statements = prepare_table(conn, f"public.{name}", "ts", **options)
    if sharded is None:
        index = next(s.split('"')[1] for s in statements if s.startswith("CREATE INDEX"))
        with conn.cursor() as cur:
            cur.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(index)))
    conn.close()


def upsert(cur: Any, name: str, first: int, count: int) -> None:
    cur.execute(sql.SQL("INSERT INTO {} (id, first, last) SELECT g, 'f' || g, 'l' || (g %% 977) "
                        "FROM generate_series(%s, %s) g ON CONFLICT (id) DO UPDATE SET "
                        "first = excluded.first").format(sql.Identifier(name)),
                (first, first + count - 1))


def watcher_on(pg: LocalPostgres, folder: Path, name: str, sharded: bool) -> WatcherSource:
    table = WatchedTable(f"public.{name}", "ts", "shard" if sharded else None,
                         tuple(range(-18, 19)) if sharded else None)
    return WatcherSource(WatcherConfig(PostgresTargetConfig(pg.dsn(), ENV), (table,),
                                       str(folder / f"{name}.log.db"), page_rows=5_000))


def detection(pg: LocalPostgres, folder: Path, rows: int, layout: str) -> tuple[float, float]:
    """(mutations written per second, mutations detected per second)."""
    name = "singers_" + layout.split()[0]
    make_table(pg, name, LAYOUTS[layout])
    source = watcher_on(pg, folder, name, bool(LAYOUTS[layout]))
    source.release(source.snapshot(source.discover(), None))
    conn = connect(pg)
    began = time.perf_counter()
    with conn.cursor() as cur:
        for first in range(0, rows, 100):
            upsert(cur, name, first, 100)
    written = rows / (time.perf_counter() - began)
    conn.close()
    detected = detection_rate(source, rows)
    source.close()
    return written, detected


def steady_latency(pg: LocalPostgres, folder: Path, rate: int, seconds: float) -> list[float]:
    """Seconds from each transaction's timestamp to the watcher's append, at `rate` rows/s."""
    make_table(pg, "steady", True)
    source = watcher_on(pg, folder, "steady", True)
    snapshot = source.snapshot(source.discover(), None)
    source.release(snapshot)
    log = ChangeLog.open(source.log_location()[0])
    stop = threading.Event()
    capture = threading.Thread(target=source.capture, args=(log, stop))
    capture.start()
    conn = connect(pg)
    began, number = time.perf_counter(), 0
    with conn.cursor() as cur:
        while time.perf_counter() - began < seconds:
            upsert(cur, "steady", number % 50_000, 20)
            number += 20
            pause = began + number / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
    conn.close()
    mark = source.mark()
    while not source.reached(log, mark):
        time.sleep(0.01)
    stop.set()
    capture.join()
    lags = append_lags(log, snapshot.cdc_start)
    source.close()
    return lags


def index_size(pg: LocalPostgres, rows: int) -> dict[str, Any]:
    make_table(pg, "sized", True)
    conn = connect(pg)
    batch, cutoff = max(1, min(10_000, rows // 100)), None
    with conn.cursor() as cur:
        for first in range(0, rows, batch):
            upsert(cur, "sized", first, batch)
            if cutoff is None and first + batch >= rows * 9 // 10:  # the oldest 90%
                cur.execute("SELECT now()")
                cutoff = cur.fetchone()[0]
    sizes = {"before": _index(conn)}
    target = watcher_on(pg, Path(tempfile.gettempdir()), "sized", True).target
    cleaned = target.clean(WatchedTable("public.sized", "ts"), to_micros(cutoff), batch)
    target.close()
    with conn.cursor() as cur:
        cur.execute("VACUUM public.sized")
        sizes["after cleanup and VACUUM"] = _index(conn)
        cur.execute("REINDEX TABLE public.sized")
        sizes["after REINDEX"] = _index(conn)
    conn.close()
    return {"rows": rows, "cleaned": cleaned, "sizes": sizes}


def _index(conn: Any) -> tuple[int, int]:
    """(rows the partial index holds, its bytes)."""
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM public.sized WHERE shard IS NOT NULL AND ts IS NOT "
                    "NULL")
        (entries,) = cur.fetchone()
        cur.execute("SELECT sum(pg_relation_size(indexrelid)) FROM pg_index WHERE indrelid = "
                    "'public.sized'::regclass AND NOT indisprimary")
        (size,) = cur.fetchone()
    return int(entries), int(size)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rate", type=int, default=2_000)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--index-rows", type=int, default=1_000_000)
    args = parser.parse_args()
    pg = LocalPostgres.start()
    os.environ[ENV] = pg.password
    pg.sql("postgres", "GRANT pg_read_all_stats TO cdc")
    try:
        run(pg, args)
    finally:
        pg.stop()


def run(pg: LocalPostgres, args: argparse.Namespace) -> None:
    print(f"1. detection of a backlog of {args.rows:,} upserts on PostgreSQL (seed's reference "
          "3,000-5,000/s per table; goal >= 10,000/s)")
    with tempfile.TemporaryDirectory() as folder:
        for layout in LAYOUTS:
            written, detected = detection(pg, Path(folder), args.rows, layout)
            print(f"   {layout:16s} detected {detected:9,.0f}/s  written {written:9,.0f}/s  "
                  f"ratio detected/written {detected / written:5.2f}  ratio to 5,000/s "
                  f"{detected / 5_000:5.2f}")
        lags = sorted(steady_latency(pg, Path(folder), args.rate, args.seconds))
    print(f"2. latency at {args.rate:,} writes/s for {args.seconds:.0f} s over {len(lags):,} "
          f"transactions: p50 {statistics.median(lags) * 1000:.0f} ms, p99 "
          f"{lags[int(len(lags) * 0.99)] * 1000:.0f} ms (the horizon margin is 200 ms)")
    size = index_size(pg, args.index_rows)
    print(f"3. partial index after {size['rows']:,} inserts, {size['cleaned']:,} rows cleaned:")
    for when, (entries, size_bytes) in size["sizes"].items():
        print(f"   {when:26s} {entries:10,} entries  {size_bytes / 2**20:8.1f} MiB")


if __name__ == "__main__":
    main()
