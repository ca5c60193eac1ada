"""`cdcflow run`: supervise the catalog's streams until interrupted (Ctrl-C saves state)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.live import Live

from cdcflow.cli.live import is_terminal, log_line, render, snapshot
from cdcflow.cli.streams import DEFAULT_CATALOG
from cdcflow.errors import CdcflowError
from cdcflow.streams.catalog import Catalog, StreamRecord
from cdcflow.streams.cluster import master_of_streams
from cdcflow.streams.home import claim_home, refuse_unmade
from cdcflow.streams.runner import Runner

ARROW_POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"


def use_system_allocator() -> None:
    """Arrow's buffers in this process come from the system allocator, unless
    ARROW_DEFAULT_MEMORY_POOL names another; so do they in the Python workers of a local
    master, which inherit the variable (a cluster's executors keep their own environment).
    With pyarrow's default pool (mimalloc in pyarrow 26) the runner settled about 110 MiB
    higher, holding freed buffers (bench/bench_memory.py, issue 11 goal 6)."""
    if os.environ.get(ARROW_POOL_VARIABLE):
        return
    os.environ[ARROW_POOL_VARIABLE] = "system"
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())


def spark_session(master: str, verbose: bool, log_path: Path) -> Any:
    """The runner's Spark session: unless verbose, Spark's own output goes to `log_path` and
    the console shows only cdcflow's. Arrow uses the system allocator (above)."""
    from cdcflow.spark import session

    use_system_allocator()
    return session("cdcflow-runner", master=master, verbose=verbose, log_path=str(log_path))


def supervise(catalog_path: str, stop: threading.Event, spark: Any, every: float = 2.0,
              as_json: bool = False, lease_seconds: float = 15.0,
              master_given: bool = False) -> None:
    """Run the runner in a thread and show progress until `stop` is set: a live table on a
    terminal, else a line per `every` seconds (JSON lines with `as_json`). While another
    runner holds the catalog's lease, this one waits and says so on stderr."""
    runner = Runner(catalog_path, spark, lease_seconds=lease_seconds, master_given=master_given)
    watch = threading.Thread(target=_report_standby, args=(runner, stop), daemon=True)
    watch.start()
    thread = threading.Thread(target=runner.run, args=(stop,), name="cdcflow-runner")
    thread.start()
    catalog = Catalog(catalog_path)
    try:
        if is_terminal() and not as_json:
            with Live(render(snapshot(catalog)), refresh_per_second=2) as live:
                while not stop.wait(0.5):
                    live.update(render(snapshot(catalog)))
        else:
            while not stop.wait(every):
                rows = snapshot(catalog)
                click.echo(json.dumps(rows, default=str) if as_json else log_line(rows))
    finally:
        stop.set()
        thread.join()


def _report_standby(runner: Runner, stop: threading.Event) -> None:
    """A line on stderr whenever this runner starts or stops waiting for the lease, and one
    when its standby warm-up is over."""
    waiting, warm_told = False, False
    while not stop.wait(0.5):
        if runner.warm_up.result is not None and not warm_told:
            warm_told = True
            click.echo(_warm_up_line(runner.warm_up.result), err=True)
        other = runner.lease.other
        if (other is not None) != waiting:
            waiting = other is not None
            click.echo(f"standby: runner {other[0]} holds this catalog's lease; this runner "
                       "takes its streams over if it stops renewing it" if other else
                       "this runner holds the catalog's lease and drives its streams",
                       err=True)


WARM_UP_SAID = ("standby: warmed up", "standby: the warm-up failed", "standby: no warm-up")
"""How each line a standby says once its warm-up is over begins (`_warm_up_line`)."""


def _warm_up_line(warm_up: dict[str, Any]) -> str:
    if "seconds" in warm_up:
        return (f"{WARM_UP_SAID[0]} in {warm_up['seconds']:.1f} s with a throwaway stream: a "
                "takeover starts warm")
    if "skipped" in warm_up:
        return f"{WARM_UP_SAID[2]}: {warm_up['skipped']}"
    return f"{WARM_UP_SAID[1]} ({warm_up['error']}): a takeover starts cold"


@click.command()
@click.option("--catalog", default=DEFAULT_CATALOG, show_default=True)
@click.option("--master", default=None,
              help="Spark master, for every stream: local[N], local[*] or spark://HOST:PORT. "
                   "Default: the master the streams' definitions name, else local[*].")
@click.option("--json", "as_json", is_flag=True, help="Progress as JSON lines.")
@click.option("--verbose", is_flag=True,
              help="Show Spark's output and progress bars (else: logs/spark.log beside the "
                   "catalog).")
@click.option("--lease-seconds", default=15.0, show_default=True,
              help="How long the catalog's runner lease lasts unrenewed: a second runner on "
                   "the catalog waits, and takes over this long after the first one dies.")
def run(catalog: str, master: str | None, as_json: bool, verbose: bool,
        lease_seconds: float) -> None:
    """Supervise streams until Ctrl-C; states stay in the catalog for the next run."""
    stop = threading.Event()
    log_path = Path(catalog).resolve().parent / "logs" / "spark.log"
    try:
        refuse_unmade(Path(catalog))  # another catalog's folder: no file made
        opened = Catalog(catalog)
        claim_home(Path(catalog).resolve().parent, opened)  # another catalog's folder: now
        chosen = master or master_of_streams(
            [record.definition for record in opened.records()
             if isinstance(record, StreamRecord)])
        spark = spark_session(chosen, verbose, log_path)  # before the handlers: Spark sets SIGINT
    except KeyboardInterrupt:  # held until the session was up: its JVM exits with this process
        click.echo("runner stopped while Spark was starting; no stream ran", err=True)
        exit_now(130)
    except CdcflowError as error:  # a master that can't be reached, or another catalog's
        # folder, before any JVM
        click.echo(f"error: {error}", err=True)
        exit_now(2)

    def interrupt(*_: Any) -> None:
        stop.set()

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    try:
        supervise(catalog, stop, spark, as_json=as_json, lease_seconds=lease_seconds,
                  master_given=master is not None)
    finally:
        spark.stop()
    message = "runner stopped; stream states saved"
    click.echo(json.dumps({"stopped": True, "message": message}) if as_json else message)
    exit_now(0)


def exit_now(code: int) -> NoReturn:
    """Leave without interpreter teardown: native thread pools (Arrow, Delta) can abort the
    process while Python finalises after a Spark session; everything is flushed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
