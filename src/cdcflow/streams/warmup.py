"""A standby runner's warm-up: fast failover.

A runner that takes a stream over starts its Spark query in a JVM and a Python process that
have never run one: classes load and compile, the foreachBatch callback server and the
Python workers start, modules are imported. That made a takeover's first batch take about
2.0 s, against 0.7 s once the runner had run this warm-up (one stream on an idle machine).
So a standby, while it waits for the lease, runs one throwaway stream end to end, once:
an embedded database with one table, in a temporary folder, into a CDC table and event
files, through the same setup, query and batch code as every stream. The folder is removed
afterwards (one left by a warm-up killed mid-way is removed by the next one on the machine);
nothing of the catalog is touched.

Only with a local master: a cluster's executors do not reach the temporary folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from cdcflow.errors import Unavailable
from cdcflow.spark.failure_text import described
from cdcflow.spark.master import is_local
from cdcflow.spark.pipeline import start_query
from cdcflow.spark.queries import QueryControl, stop_between_batches
from cdcflow.store.database import Database
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.lease import RunnerLease, process_state
from cdcflow.streams.setup import prepare_stream

PREFIX = "cdcflow-warm-up-"
"""A warm-up's temporary folder is named PREFIX + its process id + a random part."""
WARM_UP_SECONDS = 120.0
"""How long the throwaway stream may take to write its first batch."""
_TABLE = "WarmUp"
_DDL = [f"CREATE TABLE {_TABLE} (Id INT64 NOT NULL, Note STRING(MAX)) PRIMARY KEY (Id)",
        "CREATE CHANGE STREAM Everything FOR ALL"]


def warm_up(spark: Any, seconds: float = WARM_UP_SECONDS) -> dict[str, Any]:
    """Run the throwaway stream until its first batch with rows has been written; what that
    batch wrote (`rows`, ...) and the `seconds` it all took."""
    began = time.monotonic()
    remove_left_behind()
    with tempfile.TemporaryDirectory(prefix=f"{PREFIX}{os.getpid()}-") as folder:
        home = Path(folder)
        database = _database(home / "warm-up.db")
        setup = prepare_stream(StreamDefinition.parse({
            "name": "warm-up", "source": {"database": database, "change_stream": "Everything"},
            "destinations": [{"kind": "cdc_table", "warehouse": str(home / "warehouse")},
                             {"kind": "event_files", "root": str(home / "events")}],
            "spark": {"trigger_seconds": 0.1}}), home)
        written = _first_batch(spark, setup, home, seconds)
    return written | {"seconds": time.monotonic() - began}


def remove_left_behind() -> list[str]:
    """Remove the folders of warm-ups whose process is gone (killed mid-way, or ended
    without cleaning up); the names removed."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        pid = folder.name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and process_state(int(pid)) is None:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder.name)
    return removed


def _database(path: Path) -> str:
    """The throwaway database: one table, a change stream, one transaction of two rows."""
    database = Database.open(str(path))
    try:
        database.ddl(_DDL)
        transaction = database.transaction()
        for key in (1, 2):
            transaction.insert(_TABLE, {"Id": key, "Note": "warm-up"})
        transaction.commit()
    finally:
        database.close()
    return str(path)


def _first_batch(spark: Any, setup: Any, home: Path, seconds: float) -> dict[str, Any]:
    """Start the query, wait for a batch that wrote rows, stop it between batches."""
    written: dict[str, Any] = {}
    done = threading.Event()

    def on_batch(result: dict[str, Any]) -> None:
        if result["rows"] and not done.is_set():
            written.update(result)
            done.set()

    control = QueryControl(home / "warm-up.control")
    log_path, change_stream = setup.source.log_location()
    query = start_query(spark, setup.plan, log_path, change_stream, "earliest",
                        home / "checkpoint", {"processingTime": "0.1 seconds"},
                        on_batch=on_batch, control=str(control.path))
    try:
        if not _wait(done, query, seconds):
            raise Unavailable(f"the standby's warm-up stream wrote no batch within "
                                   f"{seconds:.0f} s")
    finally:
        try:
            stop_between_batches(query, control, timeout=WARM_UP_SECONDS)
        finally:
            if query.isActive:  # it would not come to rest: stopped anyway
                query.stop()
    return written


def _wait(done: threading.Event, query: Any, seconds: float) -> bool:
    """Wait for `done` while the query is alive; its failure is raised."""
    deadline = time.monotonic() + seconds
    while not done.wait(0.05):
        if not query.isActive:
            failure = query.exception()
            raise RuntimeError(f"the standby's warm-up query stopped: {failure}")
        if time.monotonic() > deadline:
            return False
    return True


def warm_standby(spark: Any, master: str) -> dict[str, Any]:
    """A standby's warm-up, as far as it can go: what `warm_up` says, else why it did not
    run (`skipped`) or what stopped it (`error`; a takeover then starts cold, nothing else
    changes)."""
    if spark is None:
        return {"skipped": "no Spark session"}
    if not is_local(master):
        return {"skipped": f"the master {master!r} is not local"}
    try:
        return warm_up(spark)
    except Exception as error:  # best effort: the standby still takes over, only slower
        return {"error": described(error, 500)}


class StandbyWarmUp:
    """A standby runner's warm-up: once, on its own thread, so that the runner's loop still
    turns and takes over when it must. Until it is over the runner's lease is not eager: a
    warm standby takes a dead holder's streams over first."""

    def __init__(self, spark: Any, master: str, lease: RunnerLease) -> None:
        self.spark, self.master, self.lease = spark, master, lease
        self.result: dict[str, Any] | None = None
        """What `warm_standby` said, once it is over."""
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Begin, unless it has begun already."""
        if self._thread is not None:
            return
        self.lease.eager = False
        self._thread = threading.Thread(target=self._run, name="cdcflow-warm-up", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        result: dict[str, Any] = {"error": "the warm-up stopped"}
        try:
            result = warm_standby(self.spark, self.master)
        finally:
            self.lease.eager = True  # eager before it says it is warm
            self.result = result
