"""Capture rate from MariaDB's binlog into the change log, against sysbench's own commit rate
(issue 12; goal: ratio >= 1.0 with lag bounded at the end).

Both measured in the same run on a throwaway server (innodb_flush_log_at_trx_commit 2,
sync_binlog 0, a 256 MB buffer pool), sysbench's tables prepared before the capture's start:
  1. sysbench oltp_write_only with 4 threads alone for --seconds, the capture not running:
     sysbench's changes/s (4 per transaction: 2 UPDATEs, a DELETE and an INSERT; checked
     against the server's row-write counters) is the baseline;
  2. the capture reads that backlog into the log: changes/s captured, ratio to 1;
  3. sysbench runs again with the capture running beside it, on the same two cores: the rate
     both reach, and the lag at the end (seconds from sysbench's end until the log holds its
     last commit).
Usage: python bench/bench_mysql_capture.py [--seconds 30] [--tables 4] [--table-size 100000]
       [--threads 4]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from cdcflow.capture.mysql.source import MySqlSource
from cdcflow.localmaria import LocalMariaDB
from mariakit import (
    CHANGES_PER_WRITE_ONLY,
    CaptureThread,
    capture_source,
    row_writes,
    start_position,
    start_server,
    sysbench,
    sysbench_ignored,
    sysbench_transactions,
)
from pgkit import logged_changes

SETTINGS: dict[str, str | None] = {"innodb-buffer-pool-size": "256M"}


def run_sysbench(server: LocalMariaDB, workload: tuple[str, ...]) -> tuple[int, float, str]:
    """sysbench's run: (transactions, tps, a line on what the server wrote)."""
    before = row_writes(server)
    output = sysbench(server, *workload, "run")
    writes = row_writes(server) - before
    transactions, tps = sysbench_transactions(output)
    note = (f"server row writes {writes:,} = {writes / max(transactions, 1):.3f} per "
            f"transaction, {sysbench_ignored(output)} deadlocks retried")
    return transactions, tps, note


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--table-size", type=int, default=100_000)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    shape = (f"--tables={args.tables}", f"--table-size={args.table_size}")
    workload = (*shape, f"--threads={args.threads}", f"--time={args.seconds}")
    server = start_server(SETTINGS)
    try:
        with tempfile.TemporaryDirectory() as folder:
            sysbench(server, *shape, "--threads=2", "prepare")
            source = capture_source(server, Path(folder), ("shop.sbtest*",))
            start_position(source)
            transactions, tps, note = run_sysbench(server, workload)
            source_rate = tps * CHANGES_PER_WRITE_ONLY
            capture = CaptureThread(source).start()
            backlog_seconds = capture.wait_for(source.mark(), 3600)
            captured = logged_changes(source.config.log_path)
            expected = transactions * CHANGES_PER_WRITE_ONLY
            print(f"sysbench oltp_write_only --threads {args.threads} --time {args.seconds}, "
                  f"{args.tables} tables of {args.table_size:,} rows, MariaDB "
                  f"{server.sql('SELECT VERSION()')[0][0]}")
            print(f"  source (sysbench alone) : {source_rate:,.0f} changes/s "
                  f"({tps:,.0f} tps, {transactions:,} transactions; {note})")
            print(f"  capture of the backlog  : {captured / backlog_seconds:,.0f} changes/s "
                  f"({captured:,} changes, {expected:,} expected, {backlog_seconds:.1f} s)")
            print(f"  ratio capture/source    : {captured / backlog_seconds / source_rate:.2f} "
                  "(goal >= 1.0)")
            concurrent(server, source, capture, workload, captured)
            capture.stop()
            source.close()
    finally:
        server.stop()


def concurrent(server: LocalMariaDB, source: MySqlSource, capture: CaptureThread,
               workload: tuple[str, ...], before: int) -> None:
    """sysbench with the capture beside it; the lag when sysbench ends."""
    began = time.perf_counter()
    transactions, tps, note = run_sysbench(server, workload)
    ended = time.perf_counter()
    lag = capture.wait_for(source.mark(), 3600)
    captured = logged_changes(source.config.log_path) - before
    print("  with the capture running beside sysbench:")
    print(f"    source  : {tps * CHANGES_PER_WRITE_ONLY:,.0f} changes/s ({tps:,.0f} tps; "
          f"{note})")
    print(f"    capture : {captured / (ended - began + lag):,.0f} changes/s over sysbench's "
          f"run plus the catch-up ({captured:,} changes, "
          f"{transactions * CHANGES_PER_WRITE_ONLY:,} expected)")
    print(f"    lag when sysbench ended: {lag:.1f} s")


if __name__ == "__main__":
    main()
