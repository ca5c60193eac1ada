"""Latency from a MariaDB commit to the row being (a) visible in its CDC table and (b) in a
committed event file, at a steady 1,000 changes/s (issue 12; the goal of issue 11 for
PostgreSQL: p50 <= 0.5 s, p99 <= 2 s).

`cdcflow run` streams sysbench's table plus a probe table (a `kind: mysql` stream) into CDC
tables and JSON event files while sysbench oltp_write_only runs at --rate 250 (4 changes per
transaction: 1,000 changes/s), with the smallest trigger (0.01 s). Measuring starts once a
first probe is visible (its delay is printed). Every --every seconds a probe row is
committed; pollers read the probe's CDC table and the event manifests and note when each row
appears (resolution: a pause and one poll, printed). The baseline, measured in the same run:
the first stage alone, commit to appended in the change log (exact: the log's commit time of
the row); each figure is printed with its ratio to it and to the goal.
Usage: python bench/bench_mysql_latency.py [--seconds 60] [--rate 250] [--every 0.2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from cdcflow.localmaria import LocalMariaDB
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from latencykit import POLL_PAUSE, Seen, logged_at
from mariakit import DATABASE, PASSWORD_ENV, start_server, sysbench, sysbench_transactions
from pgkit import wait_until
from runkit import start_runner, stop_runner

GOAL_P50, GOAL_P99 = 0.5, 2.0

PROBE = f"{DATABASE}.probe"
SHAPE = ("--tables=1", "--table-size=10000")
SETTINGS: dict[str, str | None] = {"innodb-buffer-pool-size": "256M"}


def define(catalog: Catalog, server: LocalMariaDB, folder: Path) -> None:
    catalog.create(StreamDefinition.parse({
        "name": "latency", "backfill": "none",
        "include": [f"{DATABASE}.sbtest*", PROBE],
        "source": {"kind": "mysql", "host": "127.0.0.1", "port": server.port, "user": "cdc",
                   "password_env": PASSWORD_ENV, "databases": [DATABASE],
                   "heartbeat_seconds": 1},
        "destinations": [{"kind": "cdc_table", "warehouse": str(folder / "warehouse")},
                         {"kind": "event_files", "root": str(folder / "events"),
                          "format": "json"}],
        "spark": {"trigger_seconds": 0.01}}))
    catalog.act("latency", "start")


def probe(server: LocalMariaDB, stop: threading.Event, every: float,
          committed: dict[int, float], first: int = 1) -> None:
    """Commit a probe row every `every` seconds (one at once if `stop` is set); note when
    each commit returned."""
    conn = server.connect(database=DATABASE)
    number = first
    with conn.cursor() as cur:
        while True:
            cur.execute("INSERT INTO probe VALUES (%s)", (number,))
            committed[number] = time.time()
            number += 1
            if stop.wait(every):
                break
    conn.close()


def cuts(delays: list[float]) -> tuple[float, float]:
    found = statistics.quantiles(delays, n=100)
    return found[49], found[98]


def measure(server: LocalMariaDB, folder: Path, args: argparse.Namespace) -> None:
    catalog = Catalog(folder / "catalog.db")
    define(catalog, server, folder)
    runner = start_runner(folder)
    committed: dict[int, float] = {}
    seen, stop = Seen(folder, committed, PROBE), threading.Event()
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
        tps = sysbench_transactions(sysbench(
            server, *SHAPE, "--threads=2", f"--rate={args.rate}", f"--time={args.seconds}",
            "run"))[1]
        probing.set()
        prober.join()
        wait_until(lambda: seen.has_all() or not poller.is_alive(), 600,
                   "every probe in the CDC table and the event files")
        if not poller.is_alive():
            raise RuntimeError("the poller died; see the error above")
    except BaseException:
        print((folder / "runner.log").read_text()[-3000:], file=sys.stderr)
        raise
    finally:
        stop.set()
        stop_runner(runner)
    report(seen, first, tps, logged_at(folder / "logs" / "latency.db", PROBE),
           catalog.status("latency"), args)


def report(seen: Seen, first: float, tps: float, logged: dict[int, float],
           status: dict[str, Any], args: argparse.Namespace) -> None:
    numbers = [n for n in seen.committed if n > 0]
    committed = seen.committed
    base50, base99 = cuts([logged[n] - committed[n] for n in numbers])
    print(f"commit -> visible, sysbench oltp_write_only --rate {args.rate} (~{args.rate * 4:,} "
          f"changes/s asked, {tps * 4:,.0f} reached) for {args.seconds} s, a probe every "
          f"{args.every} s, trigger 0.01 s")
    print(f"  first probe after RUNNING      : {first:,.2f} s")
    print(f"  commit -> change log (baseline): p50 {base50 * 1000:,.0f} ms, p99 "
          f"{base99 * 1000:,.0f} ms (n={len(numbers)})")
    for label, found in (("CDC table", seen.table), ("event file", seen.events)):
        p50, p99 = cuts([found[n] - committed[n] for n in numbers])
        print(f"  commit -> {label:<21}: p50 {p50 * 1000:,.0f} ms, p99 {p99 * 1000:,.0f} ms"
              f"   ratio to baseline {p50 / base50:.1f} / {p99 / base99:.1f}, to goal "
              f"(0.5 s / 2 s) {p50 / GOAL_P50:.2f} / {p99 / GOAL_P99:.2f}")
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
    server = start_server(SETTINGS)
    try:
        server.sql("CREATE TABLE probe (id INT PRIMARY KEY)", database=DATABASE)
        sysbench(server, *SHAPE, "prepare")
        with tempfile.TemporaryDirectory() as folder:
            measure(server, Path(folder), args)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
