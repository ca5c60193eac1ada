"""Latency from a PostgreSQL commit to the row being visible in its CDC table, at a steady
1,000 changes/s (issue 10; the mission's aim: sub-second).

`cdcflow run` streams pgbench's tables plus a probe table into CDC tables while pgbench runs
at -R 250 (4 changes per transaction: 1,000 changes/s). Every --every seconds a probe row is
committed; a poller reads the probe's CDC table and notes when each row appears (resolution:
one poll, printed). The baseline, measured in the same run for the same probes, is the first
stage alone: commit to appended in the change log (exact: the log's commit time of the row).
Usage: python bench/bench_pg_latency.py [--seconds 60] [--rate 250] [--every 0.2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg2

from cdcflow.localdb import LocalPostgres
from cdcflow.store.log import LOG_DATA
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.table import CdcTable
from pgkit import PASSWORD_ENV, pgbench, start_server, wait_until


def define(catalog: Catalog, server: LocalPostgres, folder: Path) -> None:
    catalog.create(StreamDefinition.parse({
        "name": "latency", "backfill": "none",
        "include": ["public.pgbench_*", "public.probe"],
        "source": {"kind": "postgres", "dsn": server.dsn(), "password_env": PASSWORD_ENV,
                   "heartbeat_seconds": 1},
        "destinations": [{"kind": "cdc_table", "warehouse": str(folder / "warehouse")}]}))
    catalog.act("latency", "start")


def probe(server: LocalPostgres, stop: threading.Event, every: float,
          committed: dict[int, float]) -> None:
    """Commit a probe row every `every` seconds; note when each commit returned."""
    conn = psycopg2.connect(server.dsn(), password=server.password)
    conn.autocommit = True
    number = 0
    with conn.cursor() as cur:
        while not stop.wait(every):
            number += 1
            cur.execute("INSERT INTO probe VALUES (%s)", (number,))
            committed[number] = time.time()
    conn.close()


def poll_table(table_root: Path, stop: threading.Event, committed: dict[int, float],
               seen: dict[int, float], polls: list[float]) -> None:
    """Read the probe's CDC table over and over; note when each probe row first shows."""
    table = wait_until(lambda: table_root.exists() and CdcTable.open(table_root), 300,
                       "the probe's CDC table")
    while not stop.is_set():
        began = time.time()
        pending = [(n,) for n in list(committed) if n not in seen]
        if pending:
            for key in table.lookup(pending):
                seen.setdefault(int(key[0]), time.time())
        polls.append(time.time() - began)
        time.sleep(0.01)


def logged_at(log_path: Path) -> dict[int, float]:
    """When each probe row was appended to the change log (the log's commit time)."""
    found: dict[int, float] = {}
    with sqlite3.connect(f"file:{log_path}?mode=ro", uri=True) as conn:
        for micros, body in conn.execute("SELECT commit_micros, body FROM _log WHERE kind = ?",
                                         (LOG_DATA,)):
            record = json.loads(body)
            if record["table_name"] == "public.probe":
                for mod in record["mods"]:
                    found[int(mod["keys"]["id"])] = micros / 1e6
    return found


def percentiles(delays: list[float]) -> str:
    cuts = statistics.quantiles(delays, n=100)
    return f"p50 {cuts[49] * 1000:,.0f} ms, p99 {cuts[98] * 1000:,.0f} ms (n={len(delays)})"


def measure(server: LocalPostgres, folder: Path, args: argparse.Namespace) -> None:
    catalog = Catalog(folder / "catalog.db")
    define(catalog, server, folder)
    runner = subprocess.Popen(
        [sys.executable, "-m", "cdcflow.cli.main", "run", "--catalog",
         str(folder / "catalog.db"), "--master", "local[2]"], start_new_session=True,
        stdout=open(folder / "runner.log", "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    committed: dict[int, float] = {}
    seen: dict[int, float] = {}
    polls: list[float] = []
    stop = threading.Event()
    try:
        wait_until(lambda: catalog.get("latency").state.value == "RUNNING", 300, "RUNNING")
        probing = threading.Event()
        threads = [threading.Thread(target=probe, args=(server, probing, args.every,
                                                         committed)),
                   threading.Thread(target=poll_table, args=(
                       folder / "warehouse" / "public.probe", stop, committed, seen, polls))]
        for thread in threads:
            thread.start()
        pgbench(server, "-c", "2", "-j", "2", "-R", str(args.rate), "-T", str(args.seconds))
        probing.set()
        threads[0].join()
        wait_until(lambda: len(seen) >= len(committed) or not threads[1].is_alive(), 600,
                   "every probe in the CDC table")
        if not threads[1].is_alive():
            raise RuntimeError("the poller died; see the error above")
        stop.set()
        for thread in threads:
            thread.join()
    finally:
        stop.set()
        os.killpg(runner.pid, signal.SIGINT)
        runner.wait(120)
    report(committed, seen, logged_at(folder / "logs" / "latency.db"), polls, args)


def report(committed: dict[int, float], seen: dict[int, float], logged: dict[int, float],
           polls: list[float], args: argparse.Namespace) -> None:
    table = [seen[n] - committed[n] for n in committed]
    log = [logged[n] - committed[n] for n in committed]
    print(f"commit -> visible, pgbench -R {args.rate} (~{args.rate * 4:,} changes/s) for "
          f"{args.seconds} s, a probe every {args.every} s")
    print(f"  baseline, commit -> change log : {percentiles(log)}")
    print(f"  commit -> CDC table            : {percentiles(table)}")
    print(f"  one poll of the CDC table took : median {statistics.median(polls) * 1000:,.0f} ms")
    ratio = statistics.median(table) / max(statistics.median(log), 1e-6)
    print(f"  ratio CDC table / change log (p50): {ratio:.1f}")


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
