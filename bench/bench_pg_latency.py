"""Latency from a PostgreSQL commit to the row being (a) visible in its CDC table and (b) in a
committed event file, at a steady 1,000 changes/s (issue 11, goal 1: p50 <= 0.5 s, p99 <= 2 s).

`cdcflow run` streams pgbench's tables plus a probe table into CDC tables and JSON event files
while pgbench runs at -R 250 (4 changes per transaction: 1,000 changes/s), with the smallest
trigger (0.01 s). Measuring starts once a first probe is visible (its delay is printed). Every
--every seconds a probe row is committed; pollers read the probe's CDC table and the event
manifests and note when each row appears (resolution: a pause and one poll, printed). Printed
beside them: the first stage alone, commit to appended in the change log (exact: the log's
commit time of the row), and the ratio of each figure to its goal.
Usage: python bench/bench_pg_latency.py [--seconds 60] [--rate 250] [--every 0.2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import psycopg2

from cdcflow.localdb import LocalPostgres
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from latencykit import POLL_PAUSE, Seen, logged_at
from pgkit import PASSWORD_ENV, pgbench, start_server, wait_until
from runkit import start_runner, stop_runner

GOAL_P50, GOAL_P99 = 0.5, 2.0



def define(catalog: Catalog, server: LocalPostgres, folder: Path) -> None:
    catalog.create(StreamDefinition.parse({
        "name": "latency", "backfill": "none",
        "include": ["public.pgbench_*", "public.probe"],
        "source": {"kind": "postgres", "dsn": server.dsn(), "password_env": PASSWORD_ENV,
                   "heartbeat_seconds": 1},
        "destinations": [{"kind": "cdc_table", "warehouse": str(folder / "warehouse")},
                         {"kind": "event_files", "root": str(folder / "events"),
                          "format": "json"}],
        "spark": {"trigger_seconds": 0.01}}))
    catalog.act("latency", "start")


def probe(server: LocalPostgres, stop: threading.Event, every: float,
          committed: dict[int, float], first: int = 1) -> None:
    """Commit a probe row every `every` seconds (one at once if `stop` is set); note when
    each commit returned."""
    conn = psycopg2.connect(server.dsn(), password=server.password)
    conn.autocommit = True
    number = first
    with conn.cursor() as cur:
        while True:
            cur.execute("INSERT INTO probe VALUES (%s)", (number,))
            committed[number] = time.time()
            number += 1
            if stop.wait(every):
                break
    conn.close()


def percentiles(delays: list[float]) -> str:
    cuts = statistics.quantiles(delays, n=100)
    return f"p50 {cuts[49] * 1000:,.0f} ms, p99 {cuts[98] * 1000:,.0f} ms (n={len(delays)})"


def measure(server: LocalPostgres, folder: Path, args: argparse.Namespace) -> None:
    catalog = Catalog(folder / "catalog.db")
    define(catalog, server, folder)
    runner = start_runner(folder)
    committed: dict[int, float] = {}
    seen, stop = Seen(folder, committed, "public.probe"), threading.Event()
    poller = threading.Thread(target=seen.poll, args=(stop,))
    try:
        wait_until(lambda: catalog.get("latency").state.value == "RUNNING", 300, "RUNNING")
        began = time.time()
        done = threading.Event()
        done.set()
        probe(server, done, 0, committed, first=0)  # the warm-up probe, not measured
        poller.start()
        wait_until(lambda: seen.has_all() or not poller.is_alive(), 300, "probe 0")
        first = max(seen.table.get(0, 0.0), seen.events.get(0, 0.0)) - began
        probing = threading.Event()
        prober = threading.Thread(target=probe, args=(server, probing, args.every, committed))
        prober.start()
        pgbench(server, "-c", "2", "-j", "2", "-R", str(args.rate), "-T", str(args.seconds))
        probing.set()
        prober.join()
        wait_until(lambda: seen.has_all() or not poller.is_alive(), 600,
                   "every probe in the CDC table and the event files")
        if not poller.is_alive():
            raise RuntimeError("the poller died; see the error above")
    finally:
        stop.set()
        stop_runner(runner)
    report(seen, first, logged_at(folder / "logs" / "latency.db", "public.probe"),
           catalog.status("latency"), args)


def report(seen: Seen, first: float, logged: dict[int, float], status: dict,
           args: argparse.Namespace) -> None:
    numbers = [n for n in seen.committed if n > 0]
    committed = seen.committed
    print(f"commit -> visible, pgbench -R {args.rate} (~{args.rate * 4:,} changes/s) for "
          f"{args.seconds} s, a probe every {args.every} s, trigger 0.01 s")
    print(f"  first probe after RUNNING      : {first:,.2f} s")
    print(f"  commit -> change log (stage 1) : "
          f"{percentiles([logged[n] - committed[n] for n in numbers])}")
    for label, found in (("CDC table", seen.table), ("event file", seen.events)):
        delays = [found[n] - committed[n] for n in numbers]
        cuts = statistics.quantiles(delays, n=100)
        print(f"  commit -> {label:<21}: {percentiles(delays)}   ratio to goal "
              f"(0.5 s / 2 s): {cuts[49] / GOAL_P50:.2f} / {cuts[98] / GOAL_P99:.2f}")
    print(f"  resolution, a pause + one poll : {POLL_PAUSE * 1000:.0f} ms + median "
          f"{statistics.median(seen.polls) * 1000:,.0f} ms")
    print(f"  batches {status.get('batches')}, rows {status.get('rows_processed')}, "
          f"last batch: {json.dumps(status.get('batch_timing'))}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--rate", type=int, default=250)
    parser.add_argument("--every", type=float, default=0.2)
    args = parser.parse_args()
    server = start_server()
    try:
        server.sql("shop", "CREATE TABLE public.probe (id int PRIMARY KEY); "
                           "ALTER TABLE public.probe OWNER TO cdc")
        pgbench(server, "-i", "-q", "-s", "1")
        with tempfile.TemporaryDirectory() as folder:
            measure(server, Path(folder), args)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
