"""Capture rate from PostgreSQL into the change log, against pgbench's own commit rate
(issue 10; goal: ratio >= 1.0 with lag bounded at the end).

Both measured in the same run on a throwaway server (synchronous_commit off, scale 10):
  1. pgbench -c 4 alone for --seconds, the slot made but not read: pgbench's changes/s (4 per
     transaction: 3 UPDATEs and an INSERT) is the baseline;
  2. the capture worker reads that backlog into the log: changes/s captured, ratio to 1;
  3. pgbench runs again with the capture running beside it, on the same two cores: the rate
     both reach, and the lag at the end (seconds from pgbench's end until the log holds its
     last commit).
Usage: python bench/bench_pg_capture.py [--seconds 30] [--scale 10] [--clients 4]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from cdcflow.capture.postgres.source import PostgresSource
from cdcflow.localdb import LocalPostgres
from pgkit import (
    CHANGES_PER_TPCB,
    CaptureThread,
    capture_source,
    create_slot,
    logged_changes,
    pgbench,
    pgbench_transactions,
    start_server,
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    workload = ("-c", str(args.clients), "-j", "2", "-T", str(args.seconds))
    server = start_server(synchronous_commit=False)
    try:
        with tempfile.TemporaryDirectory() as folder:
            pgbench(server, "-i", "-q", "-s", str(args.scale))
            source = capture_source(server, Path(folder))
            create_slot(source)
            transactions, tps = pgbench_transactions(pgbench(server, *workload))
            source_rate = tps * CHANGES_PER_TPCB
            capture = CaptureThread(source).start()
            backlog_seconds = capture.wait_for(source.mark(), 3600)
            captured = logged_changes(source.config.log_path)
            expected = transactions * CHANGES_PER_TPCB
            print(f"pgbench -c {args.clients} -T {args.seconds}, scale {args.scale}, "
                  "synchronous_commit off")
            print(f"  source (pgbench alone)  : {source_rate:,.0f} changes/s "
                  f"({tps:,.0f} tps, {transactions:,} transactions)")
            print(f"  capture of the backlog  : {captured / backlog_seconds:,.0f} changes/s "
                  f"({captured:,} changes, {expected:,} expected, {backlog_seconds:.1f} s)")
            print(f"  ratio capture/source    : {captured / backlog_seconds / source_rate:.2f} "
                  "(goal >= 1.0)")
            concurrent(server, source, capture, workload, captured)
            capture.stop()
    finally:
        server.stop()


def concurrent(server: LocalPostgres, source: PostgresSource, capture: CaptureThread,
               workload: tuple[str, ...], before: int) -> None:
    """pgbench with the capture beside it; the lag when pgbench ends."""
    outcome: dict[str, str] = {}
    runner = threading.Thread(target=lambda: outcome.update(out=pgbench(server, *workload)))
    began = time.perf_counter()
    runner.start()
    runner.join()
    ended = time.perf_counter()
    lag = capture.wait_for(source.mark(), 3600)
    transactions, tps = pgbench_transactions(outcome["out"])
    captured = logged_changes(source.config.log_path) - before
    print("  with the capture running beside pgbench:")
    print(f"    source  : {tps * CHANGES_PER_TPCB:,.0f} changes/s ({tps:,.0f} tps)")
    print(f"    capture : {captured / (ended - began + lag):,.0f} changes/s over pgbench's run "
          f"plus the catch-up ({captured:,} changes, "
          f"{transactions * CHANGES_PER_TPCB:,} expected)")
    print(f"    lag when pgbench ended: {lag:.1f} s")


if __name__ == "__main__":
    main()
