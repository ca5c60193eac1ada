"""The runner: supervises every stream of a catalog until stopped (EV-9).

STARTING streams are prepared (source, tables, then the backfill of each object from one
consistent snapshot) and become RUNNING: a Spark query reads the change log from the
snapshot's `cdc_start` on, so there is no gap and no duplicate in effect. A stream whose
source has a capture worker gets one process, restarted with backoff when it dies. Tables
are applied in the background (AP-5). PAUSED streams stop; DRAINING streams finish what is in
the log and become PAUSED. A failure is recorded as an error and the stream becomes FAILED,
then is retried with exponential backoff; `max_retries` consecutive failures, or one that no
retry can mend (InvalidArgument, FailedPrecondition), make it FAILED_PERMANENTLY. States live
in the catalog, so a restarted runner resumes every RUNNING stream from its checkpoint.
"""

from __future__ import annotations

import threading
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdcflow.clock import SYSTEM_CLOCK, Clock
from cdcflow.errors import FailedPrecondition, NotFound
from cdcflow.model.timestamps import format_rfc3339, from_micros, to_micros
from cdcflow.spark.failure_text import described
from cdcflow.spark.pipeline import start_query
from cdcflow.spark.preflight import check_storage_root
from cdcflow.spark.queries import (
    QueryControl,
    batch_timing,
    committed_micros,
    stop_between_batches,
)
from cdcflow.store.changelog import open_log
from cdcflow.store.segments import segment_summary
from cdcflow.streams.applier import Applier
from cdcflow.streams.backfill import run_backfill
from cdcflow.streams.catalog import (
    DRIVEN,
    Catalog,
    StreamGone,
    StreamRecord,
    UnreadableStream,
)
from cdcflow.streams.cluster import check_master_of, cluster_placement
from cdcflow.streams.failures import RetryPolicy, record_failure
from cdcflow.streams.home import claim_home, refuse_unmade
from cdcflow.streams.lease import RunnerLease
from cdcflow.streams.progress import count_batch
from cdcflow.streams.rebackfill import Sweeper
from cdcflow.streams.reports import ScopedReports
from cdcflow.streams.setup import StreamSetup, as_recorded, prepare_stream, start_afresh
from cdcflow.streams.source_watch import SourceWatch
from cdcflow.streams.states import StreamState
from cdcflow.streams.warmup import StandbyWarmUp
from cdcflow.streams.workers import (
    CAPTURE_FAILED,
    CaptureWorkers,
    capture_status,
    run_capture,
)

STANDBY_TURN_SECONDS = 0.1
"""A standby's loop turns this often: it starts the streams soon after the lease is its own."""


@dataclass
class Worker:
    """The live part of one stream in this runner."""

    name: str
    creation: str | None = None
    setup: StreamSetup | None = None
    query: Any = None
    reporting: Any = None  # the query whose progress reports status shows (also in a drain)
    control: QueryControl | None = None
    source_watch: SourceWatch | None = None
    thread: threading.Thread | None = None
    stats: dict[str, Any] = field(default_factory=dict)


class Runner:
    def __init__(self, catalog: str | Path, spark: Any, poll_seconds: float = 0.5,
                 max_retries: int = 5, backoff_seconds: float = 1.0,
                 max_backoff_seconds: float = 300.0, healthy_seconds: float = 60.0,
                 clock: Clock = SYSTEM_CLOCK, lease_seconds: float = 15.0,
                 master_given: bool = False) -> None:
        """`master_given`: the session's master overrides every definition's."""
        refuse_unmade(Path(catalog))  # another catalog's folder: no file made
        self.catalog = Catalog(catalog, clock)
        self.master = str(spark.sparkContext.master) if spark is not None else "local[*]"
        self.master_given = master_given
        self.home = Path(catalog).resolve().parent
        claim_home(self.home, self.catalog)  # before anything of a stream is kept there
        self.spark = spark
        self.poll_seconds = poll_seconds
        self.retry_policy = RetryPolicy(max_retries, backoff_seconds, max_backoff_seconds)
        self.healthy_seconds = healthy_seconds
        self.clock = clock
        self.workers: dict[str, Worker] = {}
        self.reports = ScopedReports(self.catalog)
        self.applier = Applier(clock, self.reports.tables, self.reports.table_failed)
        self.sweeper = Sweeper(self.catalog)
        self.capture = CaptureWorkers(clock, self.reports.capture_died)
        self.lease = RunnerLease(self.catalog, lease_seconds)
        self.warm_up = StandbyWarmUp(spark, self.master, self.lease)
        self._turned = threading.Event()
        """Set to turn the loop now, not at its next poll (a start thread ended, or a stop)."""

    # ---- the loop -------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Supervise until `stop` is set; leave states as they are (a restart resumes)."""
        threading.Thread(target=self._turn_at, args=(stop,), daemon=True,
                         name="cdcflow-stop").start()
        self.applier.start()
        self.lease.start()
        try:
            while not stop.is_set():
                self._turned.clear()  # a set from here on turns the loop again at once
                if self.lease.tick():
                    self.step()
                elif self.workers:  # another runner took the lease over: drive nothing
                    self.stand_down()
                else:  # a standby: a takeover starts warm
                    self.warm_up.start()
                self._turned.wait(self.poll_seconds if self.lease.held else
                                  STANDBY_TURN_SECONDS)
        finally:
            self.shutdown()
            self.lease.release()

    def _turn_at(self, stop: threading.Event) -> None:
        stop.wait()
        self._turned.set()

    def step(self) -> None:
        records = self.catalog.records()
        for record in records:
            if isinstance(record, UnreadableStream):  # stops itself, not the others
                if (worker := self.workers.pop(record.name, None)) is not None:
                    self._halt(worker)  # a newer cdcflow changed it under this runner
                if record.state in DRIVEN:
                    self.catalog.give_up_unreadable(record)
                continue
            try:
                self._supervise(record)
            except Exception as error:  # a stream's failure must not stop the others
                self._fail(record.definition.name, "*", error)
        self._halt_gone({record.name for record in records})

    def _halt_gone(self, names: set[str]) -> None:
        """Stop what runs for streams deleted since (a pause and a deletion within a turn),
        once their threads have ended."""
        for name in [n for n in self.workers if n not in names]:
            worker = self.workers[name]
            if worker.thread is None or not worker.thread.is_alive():
                self._halt(self.workers.pop(name))

    def shutdown(self) -> None:
        self.applier.stop()
        self.stand_down()

    def stand_down(self) -> None:
        """Stop every query, capture worker and apply this runner drives."""
        for worker in self.workers.values():
            self.applier.forget(worker.name)
            self._stop_query(worker)
            if worker.thread is not None:
                worker.thread.join(timeout=60)
        self.capture.stop_all()
        self.workers.clear()

    def _now(self) -> float:
        return to_micros(self.clock.now()) / 1e6

    def _supervise(self, record: StreamRecord) -> None:
        name = record.definition.name
        worker = self.workers.setdefault(name, Worker(name, record.creation))
        if worker.thread is not None:
            if worker.thread.is_alive():
                return
            # The thread may have moved the state after the loop read `record` (a start
            # ending in RUNNING): acting on the stale state would start the stream twice.
            worker.thread = None
            try:
                record = self.catalog.get(name)
            except NotFound:  # deleted since the loop read it
                self.workers.pop(name, None)
                return
        if worker.creation != record.creation:  # deleted and created again: nothing goes on
            self._halt(worker)
            worker = self.workers[name] = Worker(name, record.creation)
        match record.state:
            case StreamState.STARTING:
                self._halt(worker)  # what a pause, or a deletion, left within one turn
                self._in_thread(worker, self._start, record)
            case StreamState.RUNNING:
                self._keep_running(record, worker)
            case StreamState.DRAINING:
                self._in_thread(worker, self._drain, record)
            case StreamState.FAILED:
                self._halt(worker)
                self.retry_policy.retry_later(self.catalog, record, self._now())
            case _:
                self._halt(worker)
        if record.state in (StreamState.RUNNING, StreamState.PAUSED):
            if worker.source_watch is None:
                worker.source_watch = SourceWatch(self.catalog, self.home)
            worker.source_watch.look(record, worker.setup, self._now())

    def _in_thread(self, worker: Worker, target: Any, record: StreamRecord) -> None:
        """Start, drain...: on a thread of its own; the loop turns as soon as it ends, so
        that a started stream's query starts without waiting for the next turn."""

        def run() -> None:
            try:
                target(record)
            finally:
                self._turned.set()

        worker.thread = threading.Thread(target=run, daemon=True)
        worker.thread.start()

    def _halt(self, worker: Worker) -> None:
        """Stop whatever runs for a stream that should not run."""
        self._stop_query(worker)
        self.applier.forget(worker.name)
        self.capture.stop(worker.name)
        worker.setup = None

    def _fail(self, name: str, object_name: str, error: BaseException,
              catalog: Catalog | None = None) -> None:
        """Record the failure and fail the stream, through `catalog` (a scoped one: nothing
        for a stream deleted meanwhile) or else this runner's."""
        waiting = record_failure(catalog or self.catalog, name, object_name, error)
        if waiting and name in self.workers:
            self.workers[name].stats["waiting"] = True  # forgiven at its next batch

    # ---- starting, running, draining ------------------------------------------------------

    def _setup(self, record: StreamRecord, worker: Worker) -> StreamSetup:
        if worker.setup is None:
            worker.setup = prepare_stream(record.definition, self.home, self.catalog)
        return worker.setup

    def _start(self, record: StreamRecord) -> None:
        """Set the stream up and backfill it, writing only while it is the creation the loop
        read: one deleted meanwhile (and perhaps created again) stops at its next write."""
        name = record.definition.name
        worker = self.workers[name]
        catalog = self.catalog.scoped(name, record.creation)
        try:
            worker.setup = None
            check_master_of(record.definition, self.master, self.master_given)
            placement = cluster_placement(record.definition, self.master, self.home)
            if placement is not None:  # before anything is written
                check_storage_root(self.spark, placement.storage_root)
            start_afresh(record.definition, self.home, catalog)  # before its tables
            setup = self._setup(record, worker)
            for object_name in setup.keyless:
                catalog.record_error(name, object_name, (
                    f"{object_name} has no primary key: its changes go to event files only, "
                    "not to a CDC table; name its key columns in the source's primary_keys"))
            if "cdc_start" not in catalog.status(name):  # the worker starts after this
                run_backfill(setup, catalog, self.clock)
            catalog.act(name, "started")
        except StreamGone:
            worker.setup = None  # the next creation prepares its own
            return
        except Exception as error:
            try:
                self._fail(name, "*", error, catalog)
            except StreamGone:
                return

    def _ensure_capture(self, setup: StreamSetup, creation: str | None) -> None:
        """The stream's capture worker, scoped to `creation` (the one this runner drives)."""
        if setup.source.has_worker:
            definition = setup.definition
            self.capture.ensure(definition.name, run_capture,
                                (definition.model_dump_json(), self.catalog.path, creation,
                                 True), creation)

    def _keep_running(self, record: StreamRecord, worker: Worker) -> None:
        setup = self._setup(record, worker)
        self._check_capture_failed(worker.name)
        self._ensure_capture(setup, worker.creation)
        self.applier.watch(worker.name, setup.tables, setup.apply_seconds, worker.creation)
        if worker.query is None or not worker.query.isActive:
            if worker.query is not None:
                failure = worker.query.exception()
                worker.query = None
                raise RuntimeError(f"the stream's Spark query stopped: {failure}"
                                   if failure is not None else
                                   "the stream's Spark query stopped without an error")
            worker.query = self._query(record, worker)
        if record.retries and self._now() - record.changed >= self.healthy_seconds:
            self.catalog.healthy(worker.name)
            self.catalog.update_status(worker.name, waiting_for=None)
        if setup.source.has_worker and self._now() - worker.stats.get("capture_at", 0) >= 2:
            worker.stats["capture_at"] = self._now()
            found = self._capture_status(setup)
            self.catalog.update_status(worker.name, capture=found)
            self.capture.appended(worker.name, found.get("appended_at"))
            self.sweeper.sweep_due(setup, committed_micros(worker.query))

    def _check_capture_failed(self, name: str) -> None:
        """A capture worker that met an error no restart mends (a lost source position)
        left it in the status: the stream fails with it, permanently (it is taken out of the
        status, so that a reset stream tries again)."""
        failed = self.catalog.status(name).get(CAPTURE_FAILED)
        if failed:
            self.catalog.update_status(name, **{CAPTURE_FAILED: None})
            raise FailedPrecondition(f"the capture worker stopped: {failed}")

    def _capture_status(self, setup: StreamSetup) -> dict[str, Any]:
        """The capture worker's position and lag in the log, and its process."""
        log_path, _ = setup.source.log_location()
        found = capture_status(log_path, setup.source.source_id, self.clock)
        return found | (self.capture.info(setup.definition.name) or {})

    def _query(self, record: StreamRecord, worker: Worker) -> Any:
        definition = record.definition
        setup = self._setup(record, worker)
        status = self.catalog.status(definition.name)
        log_path, change_stream = setup.source.log_location()
        for key in ("rows_processed", "batches", "last_applied_commit"):
            if status.get(key) is not None and key not in worker.stats:
                worker.stats[key] = status[key]  # counters go on across runner restarts
        checkpoints = self.home / "checkpoints"
        worker.control = QueryControl(checkpoints / f"{definition.name}.control")
        worker.control.release()
        trigger = {"processingTime": f"{definition.spark.trigger_seconds} seconds"}
        placement = cluster_placement(definition, self.master, self.home)
        worker.stats["segment_root"] = placement.segment_root if placement else None
        worker.reporting = start_query(
            self.spark, as_recorded(setup.plan, status), log_path, change_stream,
            format_rfc3339(from_micros(int(status["cdc_start"]))),
            checkpoints / definition.name, trigger, definition.spark.max_records_per_trigger,
            lambda result: self._record_progress(definition.name, log_path, change_stream,
                                                 result, worker),
            control=worker.control.path,
            segment_root=placement.segment_root if placement is not None else None)
        return worker.reporting

    def _record_progress(self, name: str, log_path: str, change_stream: str,
                         result: dict[str, Any], worker: Worker) -> None:
        began = time.monotonic()
        stats = worker.stats
        counted = count_batch(stats, result, to_micros(self.clock.now()))
        active = sum(p.state == "ACTIVE" for p in open_log(log_path).partitions(change_stream))
        extra = {}
        setup = worker.setup
        if setup is not None and setup.source.has_worker:
            extra["capture"] = self._capture_status(setup)
        if worker.stats.get("segment_root"):
            extra["segments"] = segment_summary(worker.stats["segment_root"])
        catalog = self.catalog.scoped(name, worker.creation)  # a query a deletion left
        with suppress(StreamGone):
            catalog.update_status(
                name, partitions=active, **counted, **extra,
                batch_timing=batch_timing(worker.reporting, result) | {
                    "report_ms": stats.get("report_ms")})
            stats["report_ms"] = round((time.monotonic() - began) * 1000, 1)  # next batch's
            if stats.pop("waiting", False):  # it writes again: the machine's refusal is over
                catalog.healthy(name)
                catalog.update_status(name, waiting_for=None)

    def _stop_query(self, worker: Worker) -> None:
        """Stop the stream's query between batches, never inside one (see
        `cdcflow.spark.queries`); one that will not come to rest is stopped anyway."""
        query, worker.query = worker.query, None
        if query is None or not query.isActive:
            return
        try:
            stop_between_batches(query, worker.control, timeout=120)
        except Exception as error:  # it had failed, or would not come to rest
            self.reports.error(worker.name, worker.creation, "*", described(error))
            if query.isActive:
                query.stop()

    def _drain(self, record: StreamRecord) -> None:
        """Finish what is in the log now, then stop between batches: PAUSED."""
        name = record.definition.name
        worker = self.workers[name]
        catalog = self.catalog.scoped(name, record.creation)
        try:
            setup = self._setup(record, worker)
            self._catch_up_capture(setup, worker.creation)
            self.sweeper.sweep_due(setup, None)  # notes a backfill done before the target
            log_path, _ = setup.source.log_location()
            target = to_micros(open_log(log_path).current_timestamp())
            if worker.query is not None and worker.query.exception() is not None:
                raise RuntimeError(f"the stream's Spark query failed: "
                                   f"{worker.query.exception()}")
            if worker.query is None or not worker.query.isActive:
                worker.query = self._query(record, worker)
            query, worker.query = worker.query, None
            stop_between_batches(query, worker.control, until=target, timeout=None)
            self.sweeper.sweep_due(setup, target)
            self.applier.watch(name, setup.tables, setup.apply_seconds, worker.creation)
            self.applier.apply_due(name, force=True)
            self.applier.forget(name)
            catalog.act(name, "drained", ("drained", {"through": target}))
        except StreamGone:
            return
        except Exception as error:
            with suppress(StreamGone):
                self._fail(name, "*", error, catalog)

    def _catch_up_capture(self, setup: StreamSetup, creation: str | None,
                          seconds: float = 600.0) -> None:
        """A drain first lets the capture worker append everything the source committed
        before the drain began, then stops it."""
        if not setup.source.has_worker:
            return
        log_path, _ = setup.source.log_location()
        log, mark = open_log(log_path), setup.source.mark()
        deadline = self._now() + seconds
        while not setup.source.reached(log, mark):
            if self._now() > deadline:
                raise FailedPrecondition(f"the capture worker did not reach the drain's mark "
                                         f"{mark} within {seconds:.0f} s")
            self._ensure_capture(setup, creation)
            time.sleep(0.1)
        self.capture.stop(setup.definition.name)
