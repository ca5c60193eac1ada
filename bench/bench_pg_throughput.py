"""Sustained throughput from PostgreSQL into CDC tables and event files together, against the
rate pgbench commits (issue 11, goal 2: the full rate pgbench can commit, lag bounded).

All in one run, on a throwaway server (with --durability fast, the default: fsync,
full_page_writes and synchronous_commit off, pgbench's fastest; with --durability default:
all three on, as PostgreSQL ships; scale --scale, pgbench -c --clients -j 2, 4 changes a
transaction: 3 UPDATEs and an INSERT):
  1. pgbench alone for --seconds, no slot: its changes/s is the baseline;
  2. `cdcflow run` (local[2]) streams pgbench's tables into CDC tables and JSON event files
     while pgbench runs again for --seconds on the same two cores (at --rate transactions/s
     if given). Every --sample seconds the
     lag is sampled: changes pgbench committed (4 x the new rows of pgbench_history) less the
     rows the stream processed (its status, which counts a batch when it ends). The
     pipeline's rate is its rows over pgbench's run plus the catch-up. The lag is bounded if
     the catch-up after pgbench ends takes under 10 s and the last sample is at most what is
     in flight when the pipeline keeps up: one batch (--max-records) and a second of
     pgbench's input. A lag that grows for --seconds ends above that;
  3. a backlog: the stream is paused, pgbench runs alone for --seconds, the stream resumes;
     the drain rate (capture and Spark together) is set against pgbench alone (1). Every
     --sample seconds of the drain its rate is printed, with the last batch's times and the
     capture's lag behind PostgreSQL: a lag that grows means the capture sets the pace.
--backlog-only skips 2.
Usage: python bench/bench_pg_throughput.py [--seconds 60] [--scale 10] [--clients 4]
                                           [--sample 5] [--rate 0] [--backlog-only]
                                           [--durability fast|default]
                                           [--max-records 25000] [--driver-rows N]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg2

from cdcflow.localdb import LocalPostgres
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from pgkit import (
    CHANGES_PER_TPCB,
    PASSWORD_ENV,
    pgbench,
    pgbench_transactions,
    start_server,
    wait_until,
)
from runkit import batch_times, start_runner, stop_runner

NAME = "pgthroughput"


def define(catalog: Catalog, server: LocalPostgres, folder: Path, max_records: int,
           driver_rows: int | None) -> None:
    catalog.create(StreamDefinition.parse({
        "name": NAME, "backfill": "none", "include": ["public.pgbench_*"],
        "source": {"kind": "postgres", "dsn": server.dsn(), "password_env": PASSWORD_ENV},
        "destinations": [{"kind": "cdc_table", "warehouse": str(folder / "warehouse")},
                         {"kind": "event_files", "root": str(folder / "events"),
                          "format": "json"}],
        "spark": {"trigger_seconds": 0.5, "max_records_per_trigger": max_records}
        | ({} if driver_rows is None else {"driver_batch_rows": driver_rows})}))
    catalog.act(NAME, "start")


def processed(catalog: Catalog) -> int:
    return int(catalog.status(NAME).get("rows_processed") or 0)


def history_rows(server: LocalPostgres) -> int:
    """pgbench_history's rows: one per pgbench transaction committed so far."""
    with psycopg2.connect(server.dsn(), password=server.password) as conn, \
            conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pgbench_history")
        (count,) = cur.fetchone()
    conn.close()
    return int(count)


def pgbench_run(server: LocalPostgres, args: argparse.Namespace, rate: int = 0
                ) -> tuple[int, float]:
    """(transactions, tps) of one pgbench run of --seconds, at most `rate` tps if set; -n:
    pgbench_history is not truncated (nor the tables vacuumed) first, so its rows count
    every run's commits."""
    limit = ["-R", str(rate)] if rate else []
    return pgbench_transactions(pgbench(server, "-n", "-c", str(args.clients), "-j", "2",
                                        *limit, "-T", str(args.seconds)))


def beside(server: LocalPostgres, catalog: Catalog, args: argparse.Namespace
           ) -> tuple[float, list[tuple[float, int]], float, float]:
    """pgbench with the stream running: (pgbench's changes/s, lag samples (s, changes),
    the pipeline's changes/s over pgbench's run and the catch-up, the catch-up in s)."""
    base_rows, base_history = processed(catalog), history_rows(server)
    result: list[tuple[int, float]] = []
    bench = threading.Thread(target=lambda: result.append(pgbench_run(server, args, args.rate)))
    began = time.monotonic()
    bench.start()
    samples = []
    while bench.is_alive():
        bench.join(args.sample)  # the sampling interval; ends early when pgbench does
        written = CHANGES_PER_TPCB * (history_rows(server) - base_history)
        samples.append((time.monotonic() - began, written - (processed(catalog) - base_rows)))
    ended = time.monotonic()
    tps = result[0][1]
    expected = CHANGES_PER_TPCB * (history_rows(server) - base_history)
    wait_until(lambda: processed(catalog) - base_rows >= expected, 1800,
               f"{expected:,} changes processed")
    caught_up = time.monotonic()
    return tps * CHANGES_PER_TPCB, samples, expected / (caught_up - began), caught_up - ended


def backlog(server: LocalPostgres, catalog: Catalog, args: argparse.Namespace
            ) -> tuple[int, float, float, list[str]]:
    """Pause (capture and query stop), pgbench alone, resume: (changes drained after the
    first batch, seconds from that batch to the last, seconds from resume to that batch,
    the drain's rate and last batch every --sample seconds)."""
    catalog.act(NAME, "pause")
    wait_until(lambda: catalog.get(NAME).state.value == "PAUSED", 300, "PAUSED")
    base_rows = processed(catalog)
    transactions, _ = pgbench_run(server, args)
    expected = CHANGES_PER_TPCB * transactions
    resumed_at = processed(catalog)
    catalog.act(NAME, "resume")
    began = time.monotonic()
    first = wait_until(lambda: max(processed(catalog) - resumed_at, 0), 600,
                       "the first batch after the resume") + resumed_at - base_rows
    first_at = time.monotonic()
    trend, last = [], (first_at, first)
    while (done := processed(catalog) - base_rows) < expected:
        now = time.monotonic()
        if now - first_at > 1800:
            raise TimeoutError(f"{expected:,} backlog changes not processed within 1800 s")
        if now - last[0] >= args.sample:
            trend.append(f"{now - first_at:.0f} s: {(done - last[1]) / (now - last[0]):,.0f}"
                         f"/s, {batch_summary(catalog.status(NAME))}")
            last = (now, done)
        time.sleep(0.02)  # polling for the end, as wait_until does
    return expected - first, time.monotonic() - first_at, first_at - began, trend


def batch_summary(status: dict[str, Any]) -> str:
    """The last batch's times, and the capture's lag behind the source (seconds from a
    commit in PostgreSQL to its capture)."""
    capture = status.get("capture") or {}
    return f"last batch {batch_times(status)}; capture lag {capture.get('lag_seconds', '?')} s"


def run(server: LocalPostgres, folder: Path, args: argparse.Namespace) -> None:
    _, alone_tps = pgbench_run(server, args)
    catalog = Catalog(folder / "catalog.db")
    define(catalog, server, folder, args.max_records, args.driver_rows)
    runner = start_runner(folder)
    try:
        wait_until(lambda: catalog.get(NAME).state.value == "RUNNING"
                   and "cdc_start" in catalog.status(NAME), 600, "RUNNING")
        sustained = beside(server, catalog, args) if not args.backlog_only else None
        drained = backlog(server, catalog, args)
        errors = catalog.errors(NAME)
    finally:
        stop_runner(runner)
    report(args, alone_tps * CHANGES_PER_TPCB, sustained, drained, errors)


def report(args: argparse.Namespace, alone: float,
           sustained: tuple[float, list[tuple[float, int]], float, float] | None,
           drained: tuple[int, float, float, list[str]], errors: list) -> None:
    print(f"PostgreSQL -> CDC tables and JSON event files, pgbench -c {args.clients} -T "
          f"{args.seconds}, scale {args.scale}, durability {args.durability}, local[2]")
    print(f"  pgbench alone (the baseline)   : {alone:,.0f} changes/s")
    if sustained is not None:
        report_beside(args, sustained)
    changes, seconds, startup, trend = drained
    print(f"  backlog drained at {changes / seconds:,.0f} changes/s ({changes:,} changes after "
          f"the first batch, which came {startup:.1f} s after the resume); ratio to pgbench "
          f"alone {changes / seconds / alone:.2f}")
    print("  the drain every --sample seconds:" + "".join(f"\n    {line}" for line in trend))
    kinds = sorted({str(error.get("message", error))[:80] for error in errors})
    print(f"  stream errors: {len(errors)}" + "".join(f"\n    {kind}" for kind in kinds))


def report_beside(args: argparse.Namespace,
                  sustained: tuple[float, list[tuple[float, int]], float, float]) -> None:
    with_stream, samples, pipeline, catch_up = sustained
    lags = [lag for _, lag in samples]
    bounded = catch_up < 10 and lags[-1] <= args.max_records + with_stream
    asked = f" (asked {args.rate * CHANGES_PER_TPCB:,}/s)" if args.rate else ""
    print(f"  pgbench with the stream beside : {with_stream:,.0f} changes/s{asked}")
    print(f"  pipeline over that run         : {pipeline:,.0f} changes/s (with the catch-up of "
          f"{catch_up:.1f} s); ratio to pgbench beside it {pipeline / with_stream:.2f}")
    print(f"  lag, changes: first {lags[0]:,}, max {max(lags):,}, last {lags[-1]:,} -> "
          f"{'bounded' if bounded else 'NOT bounded'}")
    print("  lag samples (s: thousands of changes): " + ", ".join(
        f"{at:.0f}: {lag / 1000:.0f}" for at, lag in samples))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--sample", type=float, default=5.0)
    parser.add_argument("--rate", type=int, default=0,
                        help="pgbench's transactions/s beside the stream (-R); 0: as fast as "
                             "it can")
    parser.add_argument("--driver-rows", type=int, default=None,
                        help="the stream's spark.driver_batch_rows (default: the definition's)")
    parser.add_argument("--max-records", type=int, default=25_000,
                        help="the stream's spark.max_records_per_trigger")
    parser.add_argument("--backlog-only", action="store_true",
                        help="skip pgbench beside the running stream: the baseline, then the "
                             "backlog and its drain")
    parser.add_argument("--durability", choices=("fast", "default"), default="fast",
                        help="fast: fsync, full_page_writes and synchronous_commit off; "
                             "default: PostgreSQL's (a WAL flush per commit)")
    args = parser.parse_args()
    default = args.durability == "default"
    server = start_server(synchronous_commit=default, durable=default)
    try:
        pgbench(server, "-i", "-q", "-s", str(args.scale))
        server.sql("shop", "VACUUM ANALYZE")
        with tempfile.TemporaryDirectory() as folder:
            run(server, Path(folder), args)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
