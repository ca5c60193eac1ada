"""Sustained throughput from the embedded log into a CDC table and event files together, through
`cdcflow run` (issue 11, goal 2: >= 50,000 changes/s with lag that stays bounded over 5 min).

Two measurements in one run:
- drain: once the stream runs, it is paused, --backlog changes are committed (transactions
  of --rows upserts over --keys keys) and the stream is resumed; the figure is changes/s from
  the first batch after the resume to the last change applied, read from the stream's own
  status (`rows_processed`; rows applied before the pause took effect are not counted).
  The rate from the resume is printed too: before its first batch, a reader settles the
  backlog's journal (renders its commits' records: `cdcflow.store.journal`);
- sustained: a writer process commits at --rate changes/s for --seconds while the stream
  runs; the lag (changes written but not yet applied) is sampled every --sample seconds.
  Bounded means the last sample's lag is under one second of input.
The runner's JVM compiles Spark's code paths during its first minute (its C2 compiler took
6-8 s of CPU in a first drain here, 2 s in each later one), so --warm-up-drains drains (1 by
default) of the same backlog run first; their rates are printed as well, and the measured
drain is the one after them.
The baseline is the goal, 50,000 changes/s; the ratio printed is figure / goal. The writer's
own rate is printed beside it: on two cores, the writer and the pipeline share them.
Usage: python bench/bench_throughput.py [--backlog 300000] [--warm-up-drains 1] [--rate 5000]
                                        [--seconds 300]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Any

from cdcflow.store.database import Database
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from pgkit import wait_until
from runkit import batch_times, start_runner, stop_runner

GOAL = 50_000


def prepare(folder: Path, trigger: float, per_trigger: int) -> Catalog:
    database = Database.open(str(folder / "shop.db"))
    database.ddl("CREATE TABLE Accounts (Id INT64 NOT NULL, Owner STRING(MAX), "
                 "Balance INT64) PRIMARY KEY (Id)")
    database.ddl("CREATE CHANGE STREAM Everything FOR ALL")
    catalog = Catalog(folder / "catalog.db")
    catalog.create(StreamDefinition.parse({
        "name": "throughput", "backfill": "none",
        "source": {"database": str(folder / "shop.db"), "change_stream": "Everything"},
        "destinations": [{"kind": "cdc_table", "warehouse": str(folder / "warehouse")},
                         {"kind": "event_files", "root": str(folder / "events"),
                          "format": "json"}],
        "spark": {"trigger_seconds": trigger, "max_records_per_trigger": per_trigger}}))
    catalog.act("throughput", "start")
    return catalog


def commit_changes(database: Database, first: int, count: int, rows: int, keys: int) -> None:
    """`count` upserts from number `first` on, `rows` per transaction."""
    for start in range(first, first + count, rows):
        with database.transaction() as tx:
            for number in range(start, min(start + rows, first + count)):
                tx.insert_or_update("Accounts", {"Id": number % keys, "Owner": f"o{number % 97}",
                                                 "Balance": number})


def write(path: str, rate: float, seconds: float, rows: int, keys: int, first: int,
          written: Any) -> None:
    """Upserts at `rate` changes/s in transactions of `rows` (a process of its own); the
    count so far goes to `written`."""
    database = Database.open(path, create=False)
    began = time.monotonic()
    while time.monotonic() < began + seconds:
        commit_changes(database, first + written.value, rows, rows, keys)
        written.value += rows
        pause = began + written.value / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)


def processed(catalog: Catalog) -> int:
    return int(catalog.status("throughput").get("rows_processed") or 0)


def drain(catalog: Catalog, database: Database, args: argparse.Namespace,
          first_number: int) -> tuple[int, float, float, float]:
    """Pause the running stream, commit the backlog, resume: (changes applied after the
    first batch after the resume, seconds from that batch to the last, seconds to that first
    batch, the backlog's commit rate)."""
    state = lambda: catalog.get("throughput").state.value  # noqa: E731
    wait_until(lambda: state() == "RUNNING" and "cdc_start" in catalog.status("throughput"),
               600, "RUNNING")
    catalog.act("throughput", "pause")
    before = processed(catalog)
    began = time.monotonic()
    commit_changes(database, first_number, args.backlog, args.rows, args.keys)
    backlog_rate = args.backlog / (time.monotonic() - began)
    resumed_at = processed(catalog)
    catalog.act("throughput", "resume")
    began = time.monotonic()
    after_first = wait_until(lambda: max(processed(catalog) - resumed_at, 0), 600,
                             "the first batch after resume") + resumed_at
    first = time.monotonic()
    wait_until(lambda: processed(catalog) >= before + args.backlog, 3600,
               f"{args.backlog:,} changes applied")
    return before + args.backlog - after_first, time.monotonic() - first, first - began, \
        backlog_rate


def sustain(folder: Path, catalog: Catalog, args: argparse.Namespace
            ) -> tuple[list[tuple[float, int, str]], float]:
    """Lag samples (seconds since start, changes behind, the last batch's size and times)
    while a writer runs at --rate; and the writer's achieved rate."""
    written = multiprocessing.get_context("spawn").Value("q", 0)
    base = processed(catalog)
    writer = multiprocessing.get_context("spawn").Process(
        target=write, args=(str(folder / "shop.db"), args.rate, args.seconds, args.rows,
                            args.keys, (args.warm_up_drains + 1) * args.backlog, written))
    began = time.monotonic()
    writer.start()
    samples = []
    while writer.is_alive():
        time.sleep(args.sample)  # the sampling interval, not a wait for another process
        samples.append((time.monotonic() - began, written.value - (processed(catalog) - base),
                        batch_times(catalog.status("throughput"))))
    writer.join()
    return samples, written.value / (time.monotonic() - began)


def check_outputs(folder: Path, expected_events: int) -> tuple[int, int]:
    """Events in the committed manifests, and rows in the CDC table."""
    from cdcflow.table import CdcTable

    manifests = folder / "events" / "throughput" / "_manifests"
    events = sum(entry.get("events", 0) for manifest in manifests.glob("batch-*.json")
                 for entry in json.loads(manifest.read_text())["files"])
    rows = CdcTable.open(folder / "warehouse" / "Accounts").to_arrow().num_rows
    if expected_events and events and events < expected_events:
        print(f"  note: the manifests list {events:,} events of {expected_events:,}")
    return events, rows


def run(folder: Path, args: argparse.Namespace) -> None:
    catalog = prepare(folder, args.trigger, args.per_trigger)
    database = Database.open(str(folder / "shop.db"), create=False)
    runner = start_runner(folder)
    try:
        warm_ups = [drain(catalog, database, args, round_ * args.backlog)
                    for round_ in range(args.warm_up_drains)]
        drained = drain(catalog, database, args, args.warm_up_drains * args.backlog)
        samples, writer_rate = sustain(folder, catalog, args) if args.seconds > 0 else ([], 0)
        outputs = check_outputs(folder, (args.warm_up_drains + 1) * args.backlog)
        status = catalog.status("throughput")
    finally:
        stop_runner(runner)
    report(args, warm_ups, drained, samples, writer_rate, outputs, status)


def report(args: argparse.Namespace, warm_ups: list[tuple[int, float, float, float]],
           drained: tuple[int, float, float, float],
           samples: list[tuple[float, int, str]],
           writer_rate: float, outputs: tuple[int, int], status: dict[str, Any]) -> None:
    changes, seconds, startup, backlog_rate = drained
    rate = changes / seconds
    print(f"throughput into a CDC table and JSON event files, embedded source, trigger "
          f"{args.trigger} s, at most {args.per_trigger:,} changes per batch, local[2]")
    for number, (count, took, _, _) in enumerate(warm_ups, 1):
        print(f"  warm-up drain {number}: {count / took:,.0f} changes/s; ratio to the goal "
              f"{count / took / GOAL:.2f}")
    print(f"  backlog: {args.backlog:,} changes committed at {backlog_rate:,.0f}/s while paused "
          f"({args.rows} upserts per transaction, {args.keys:,} keys)")
    print(f"  drain  : {rate:,.0f} changes/s ({changes:,} changes in {seconds:.1f} s after the "
          f"first batch, which came {startup:.1f} s after the resume); ratio to the goal "
          f"{GOAL:,}/s: {rate / GOAL:.2f}")
    whole = args.backlog / (startup + seconds)
    print(f"  drain from the resume, the first batch's planning (and the journal's settling) "
          f"included: {whole:,.0f} changes/s; ratio to the goal: {whole / GOAL:.2f}")
    if samples:
        for at, lag, batch in samples:
            print(f"    at {at:5.0f} s: lag {lag:,}; last batch {batch}")
        lags = [lag for _, lag, _ in samples]
        bounded = lags[-1] < args.rate
        print(f"  sustained: writer asked {args.rate:,.0f}/s for {args.seconds:.0f} s, "
              f"achieved {writer_rate:,.0f}/s; lag first {lags[0]:,}, max {max(lags):,}, "
              f"last {lags[-1]:,} changes -> {'bounded' if bounded else 'NOT bounded'}; "
              f"ratio to the goal: {min(writer_rate, args.rate) / GOAL:.2f}")
    print(f"  outputs: {outputs[0]:,} events in manifests, {outputs[1]:,} rows in the CDC "
          f"table; last batch: {json.dumps(status.get('batch_timing'))}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backlog", type=int, default=300_000)
    parser.add_argument("--warm-up-drains", type=int, default=1)
    parser.add_argument("--rate", type=float, default=5_000)
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--rows", type=int, default=100, help="upserts per transaction")
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--trigger", type=float, default=0.5)
    parser.add_argument("--per-trigger", type=int, default=25_000)
    parser.add_argument("--sample", type=float, default=5.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        run(Path(folder), args)


if __name__ == "__main__":
    main()
