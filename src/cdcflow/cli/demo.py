"""`cdcflow demo`: the main job on the embedded default database.

1. An embedded database with Singers and AccountBalance, and a change stream FOR ALL.
2. A workload in its own process (inserts, updates, deletes, transfers across partitions).
3. A stream into CDC tables and JSON event files, run by the runner with the live display.
4. After --duration it drains, runs `cdcflow verify` (every CDC table and the events equal
   their source table), and prints a summary: changes, throughput, lag p50/p99, outputs and
   how to look at them.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import shutil
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import click

from cdcflow.cli.run import exit_now, spark_session, supervise
from cdcflow.errors import FailedPrecondition
from cdcflow.model.partitions import PartitionPolicy
from cdcflow.store.database import Database
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.states import StreamState
from cdcflow.streams.verify import verify
from cdcflow.workload import DEMO_DDL, run_workload


def _prepare(folder: Path) -> tuple[str, Catalog, StreamDefinition]:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    path = str(folder / "shop.db")
    db = Database.open(path, partition_policy=PartitionPolicy(
        split_records=400, max_partitions=6, merge_min_age_seconds=10.0,
        merge_max_records_per_second=3.0))
    db.ddl(DEMO_DDL)
    db.ddl("CREATE CHANGE STREAM Everything FOR ALL OPTIONS (retention_period = '1d', "
           "value_capture_type = 'OLD_AND_NEW_VALUES')")
    run_workload(path, seconds=1.0, rate=100.0, seed=99)  # rows for the backfill
    definition = StreamDefinition.parse({
        "name": "demo", "source": {"database": path, "change_stream": "Everything"},
        "backfill": "all",
        "destinations": [
            {"kind": "cdc_table", "warehouse": str(folder / "warehouse")},
            {"kind": "event_files", "root": str(folder / "events"), "format": "json"},
        ],
        "spark": {"trigger_seconds": 1.0},
    })
    catalog = Catalog(folder / "catalog.db")
    catalog.create(definition)
    return path, catalog, definition


def _wait(catalog: Catalog, state: StreamState, stop: threading.Event, seconds: float,
          drain: bool = False) -> None:
    """Poll until the stream is in `state`. `drain`: a failure while draining ends the drain
    (the runner retries the stream into RUNNING), so ask for it again."""
    deadline = time.monotonic() + seconds
    while (current := catalog.get("demo").state) != state:
        if current == StreamState.FAILED_PERMANENTLY:
            raise click.ClickException(f"the stream failed: {catalog.errors('demo')[:3]}")
        if drain and current == StreamState.RUNNING:
            with contextlib.suppress(FailedPrecondition):  # it moved on meanwhile
                catalog.act("demo", "drain")
        if time.monotonic() > deadline or stop.is_set():
            raise click.ClickException(f"the stream did not reach {state.value}")
        time.sleep(0.3)


def _verify(catalog: Catalog) -> dict[str, Any]:
    """`cdcflow verify` on the drained stream: every object against its CDC table and its
    events, at the drain's log time."""
    report = verify(catalog, "demo")
    return {item["object"]: {"rows": item["rows"], "equal": item["equal"],
                             "cdc_table": item["cdc_table"]["equal"],
                             "events": item["events"]["equal"]}
            for item in report["objects"]}


@click.command()
@click.option("--duration", default=60.0, show_default=True, help="Seconds of workload.")
@click.option("--rate", default=40.0, show_default=True, help="Transactions per second.")
@click.option("--output", default="demo-output", show_default=True, type=click.Path())
@click.option("--master", default="local[*]", show_default=True, help="Spark master.")
@click.option("--json", "as_json", is_flag=True, help="Only the JSON summary on stdout.")
@click.option("--verbose", is_flag=True,
              help="Show Spark's output and progress bars (else: spark.log in the output).")
def demo(duration: float, rate: float, output: str, master: str, as_json: bool,
         verbose: bool) -> None:
    """Run a workload into an embedded database and stream it into CDC tables and events."""
    folder = Path(output).resolve()
    path, catalog, _ = _prepare(folder)
    catalog.act("demo", "start")
    stop = threading.Event()
    spark = spark_session(master, verbose, folder / "spark.log")
    display = threading.Thread(target=supervise, args=(str(folder / "catalog.db"), stop, spark),
                               kwargs={"as_json": as_json})
    display.start()
    began = time.monotonic()
    try:
        _wait(catalog, StreamState.RUNNING, stop, 180)
        workload = multiprocessing.get_context("spawn").Process(
            target=run_workload, args=(path, duration, rate))
        workload.start()
        workload.join()
        catalog.act("demo", "drain")
        _wait(catalog, StreamState.PAUSED, stop, 300, drain=True)
    finally:
        stop.set()
        display.join()
        spark.stop()
    elapsed = time.monotonic() - began
    status = catalog.status("demo")
    checks = _verify(catalog)
    lags = sorted(status.get("lag_samples") or [0.0])
    p99 = lags[min(len(lags) - 1, int(0.99 * len(lags)))]
    summary = {
        "changes": status.get("rows_processed", 0),
        "throughput_rows_per_second": round(status.get("rows_processed", 0) / elapsed, 1),
        "lag_p50_seconds": round(statistics.median(lags), 3),
        "lag_p99_seconds": round(p99, 3),
        "backfill": status.get("backfill"),
        "partitions": status.get("partitions"),
        "tables": {name: {"apply_watermark": t["apply_watermark"],
                          "pending_rows": t["pending_rows"]}
                   for name, t in (status.get("tables") or {}).items()},
        "errors": [e["message"] for e in catalog.errors("demo")],
        "verification": checks,
        "outputs": {"database": path, "cdc_tables": str(folder / "warehouse"),
                    "events": str(folder / "events" / "demo")},
    }
    table = folder / "warehouse" / "AccountBalance"
    summary["look"] = (f"python -c \"import deltalake; print(deltalake.DeltaTable('{table}')"
                       ".to_pandas().head())\"")
    summary["verification_passed"] = all(c["equal"] for c in checks.values())
    click.echo(json.dumps(summary, indent=None if as_json else 2))
    if not summary["verification_passed"]:
        click.echo("error: verification failed: a CDC table or the events differ from the "
                   "source", err=True)
        exit_now(1)
    if summary["errors"]:
        click.echo(f"error: the stream recorded errors: {summary['errors'][:3]}", err=True)
        exit_now(1)
    if not as_json:
        click.echo("verification passed (cdcflow verify): every CDC table and the events "
                   "rebuild their source table")
    exit_now(0)
