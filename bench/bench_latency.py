"""Latency from an embedded-database commit to (a) visible in the CDC table and (b) durable in
an event file, at a steady 1,000 changes/s, through `cdcflow run` (issue 11, goal 1).

A writer process commits 5-row transactions into `Accounts` at --rate changes/s. Every --every
seconds a probe row is committed into `Probe`; one poller reads the probe's CDC table
(`CdcTable.lookup`) and another the event files' committed manifests, and each notes when a
probe first shows. The stream's smallest trigger (0.01 s) is used. Measuring starts after a
first probe is visible (its delay is printed: the cost of the first batches). The goals are the
baseline: p50 <= 0.5 s and p99 <= 2 s; the ratio printed is figure / goal. The stream's own
report of its last batch says where a batch's time goes (Spark's phases and cdcflow's write).
Usage: python bench/bench_latency.py [--seconds 60] [--rate 1000] [--every 0.2]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import tempfile
import threading
import time
from pathlib import Path

from cdcflow.events.files import read_json_events
from cdcflow.store.database import Database
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.table import CdcTable
from pgkit import wait_until
from runkit import start_runner, stop_runner

GOAL_P50, GOAL_P99 = 0.5, 2.0
POLL_PAUSE = 0.05  # seconds between polls: the resolution is this plus one poll
ROWS_PER_TRANSACTION = 5


def prepare(folder: Path, spark: dict[str, object] | None = None) -> Catalog:
    """The tables, the change stream and the started stream; `spark` adds to its settings."""
    database = Database.open(str(folder / "shop.db"))
    database.ddl(["CREATE TABLE Accounts (Id INT64 NOT NULL, Owner STRING(MAX), "
                  "Balance INT64) PRIMARY KEY (Id)",
                  "CREATE TABLE Probe (Id INT64 NOT NULL) PRIMARY KEY (Id)"])
    database.ddl("CREATE CHANGE STREAM Everything FOR ALL")
    catalog = Catalog(folder / "catalog.db")
    catalog.create(StreamDefinition.parse({
        "name": "latency", "backfill": "none",
        "source": {"database": str(folder / "shop.db"), "change_stream": "Everything"},
        "destinations": [{"kind": "cdc_table", "warehouse": str(folder / "warehouse")},
                         {"kind": "event_files", "root": str(folder / "events"),
                          "format": "json"}],
        "spark": {"trigger_seconds": 0.01, **(spark or {})}}))
    catalog.act("latency", "start")
    return catalog


def write(path: str, rate: float, seconds: float) -> None:
    """5-row upsert transactions at `rate` changes/s (a process of its own)."""
    database = Database.open(path, create=False)
    began, number = time.monotonic(), 0
    while time.monotonic() < began + seconds:
        number += 1
        with database.transaction() as tx:
            for k in range(ROWS_PER_TRANSACTION):
                tx.insert_or_update("Accounts", {"Id": (number * 7 + k) % 100_000,
                                                 "Owner": f"o{k}", "Balance": number})
        pause = began + number * ROWS_PER_TRANSACTION / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)


class Probes:
    """Commits probe rows and notes when each shows in the CDC table and in event files."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.database = Database.open(str(folder / "shop.db"), create=False)
        self.committed: dict[int, float] = {}
        self.in_table: dict[int, float] = {}
        self.in_events: dict[int, float] = {}
        self.manifests: set[Path] = set()

    def commit(self, number: int) -> None:
        with self.database.transaction() as tx:
            tx.insert("Probe", {"Id": number})
        self.committed[number] = time.time()

    def poll_table(self, table: CdcTable) -> None:
        pending = [(n,) for n in list(self.committed) if n not in self.in_table]
        for key in table.lookup(pending) if pending else {}:
            self.in_table.setdefault(int(key[0]), time.time())

    def poll_events(self) -> None:
        folder = self.folder / "events" / "latency" / "_manifests"
        for manifest in sorted(set(folder.glob("batch-*.json")) - self.manifests):
            self.manifests.add(manifest)
            for entry in json.loads(manifest.read_text())["files"]:
                if "Probe" in entry["path"]:
                    for event in read_json_events(self.folder / "events" / "latency" /
                                                  entry["path"]):
                        self.in_events.setdefault(int(event["payload"]["Id"]), time.time())

    def poll(self, stop: threading.Event) -> None:
        table = wait_until(lambda: (self.folder / "warehouse" / "Probe").exists()
                           and CdcTable.open(self.folder / "warehouse" / "Probe"), 300,
                           "the probe's CDC table")
        while not stop.is_set():
            self.poll_table(table)
            self.poll_events()
            time.sleep(POLL_PAUSE)  # a pause, so the poller leaves the cores to the pipeline


def percentiles(delays: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(delays, n=100)
    return cuts[49], cuts[98]


def report(probes: Probes, first: float, status: dict, args: argparse.Namespace) -> None:
    numbers = [n for n in probes.committed if n > 0]
    print(f"commit -> visible, embedded source, {args.rate:,.0f} changes/s for {args.seconds} s, "
          f"a probe every {args.every} s ({len(numbers)} probes), trigger 0.01 s")
    print(f"  first probe after RUNNING          : {first:,.2f} s")
    for label, seen in (("CDC table", probes.in_table), ("event file", probes.in_events)):
        p50, p99 = percentiles([seen[n] - probes.committed[n] for n in numbers])
        print(f"  commit -> {label:<11}: p50 {p50 * 1000:7,.0f} ms, p99 {p99 * 1000:7,.0f} ms"
              f"   ratio to goal (0.5 s / 2 s): {p50 / GOAL_P50:.2f} / {p99 / GOAL_P99:.2f}")
    print(f"  resolution: a pause of {POLL_PAUSE * 1000:.0f} ms and one poll of the table and "
          f"the manifests")
    print(f"  batches {status.get('batches')}, rows {status.get('rows_processed')}, "
          f"last batch: {json.dumps(status.get('batch_timing'))}")


def measure(folder: Path, args: argparse.Namespace) -> None:
    catalog = prepare(folder)
    probes, first = run_probes(folder, catalog, ["--master", "local[2]"], args)
    report(probes, first, catalog.status("latency"), args)


def run_probes(folder: Path, catalog: Catalog, options: list[str], args: argparse.Namespace
               ) -> tuple[Probes, float]:
    """`cdcflow run` with `options` on the prepared catalog, the writer at --rate for
    --seconds, a probe every --every s; the probes, and when the first one showed."""
    runner = start_runner(folder, options)
    probes, stop = Probes(folder), threading.Event()
    poller = threading.Thread(target=probes.poll, args=(stop,))
    try:
        wait_until(lambda: catalog.get("latency").state.value == "RUNNING", 300, "RUNNING")
        began = time.time()
        probes.commit(0)
        poller.start()
        wait_until(lambda: 0 in probes.in_table and 0 in probes.in_events, 300, "probe 0")
        first = max(probes.in_table[0], probes.in_events[0]) - began
        writer = multiprocessing.get_context("spawn").Process(
            target=write, args=(str(folder / "shop.db"), args.rate, args.seconds))
        writer.start()
        number, start = 0, time.monotonic()
        while writer.is_alive():
            number += 1
            probes.commit(number)
            time.sleep(max(0.0, start + number * args.every - time.monotonic()))
        wait_until(lambda: all(n in probes.in_table and n in probes.in_events
                               for n in probes.committed) or not poller.is_alive(), 600,
                   "every probe in the CDC table and the event files")
    finally:
        stop.set()
        stop_runner(runner)
    if poller.is_alive():
        poller.join()
    return probes, first


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--rate", type=float, default=1000)
    parser.add_argument("--every", type=float, default=0.2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        measure(Path(folder), args)


if __name__ == "__main__":
    main()
