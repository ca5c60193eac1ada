"""The runner: supervises every stream of a catalog until stopped (EV-9).

STARTING streams are prepared (destinations, then the backfill of each object from one
consistent snapshot at T) and become RUNNING, whose Spark query reads changes from T on, so
there is no gap and no duplicate in effect. PAUSED streams stop; DRAINING streams finish what
is available and become PAUSED; a failed query is recorded as an error, FAILED, and retried with
exponential backoff until `max_retries`, then FAILED_PERMANENTLY. States live in the catalog,
so a restarted runner resumes every RUNNING stream from its checkpoint.
"""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from cdcflow.model.events import backfill_event
from cdcflow.model.records import ColumnTypeInfo
from cdcflow.model.timestamps import format_rfc3339, from_micros, to_micros
from cdcflow.spark.pipeline import ensure_tables
from cdcflow.store.database import Database
from cdcflow.streams.batches import BatchPlan, cdc_destination, run_batch
from cdcflow.streams.catalog import Catalog, StreamRecord
from cdcflow.streams.states import StreamState
from cdcflow.table import CdcTable


@dataclass
class Worker:
    """The live part of one stream in this runner."""

    name: str
    query: Any = None
    thread: threading.Thread | None = None
    failed_at: float | None = None
    stats: dict[str, Any] = field(default_factory=dict)


class Runner:
    def __init__(self, catalog: str | Path, spark: Any, poll_seconds: float = 0.5,
                 max_retries: int = 3, backoff_seconds: float = 1.0) -> None:
        self.catalog = Catalog(catalog)
        self.home = Path(catalog).resolve().parent
        self.spark = spark
        self.poll_seconds = poll_seconds
        self.max_retries = max_retries
        self.backoff_seconds = backoff_seconds
        self.workers: dict[str, Worker] = {}

    # ---- the loop -------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Supervise until `stop` is set; leave states as they are (a restart resumes)."""
        try:
            while not stop.is_set():
                self.step()
                stop.wait(self.poll_seconds)
        finally:
            self.shutdown()

    def step(self) -> None:
        for record in self.catalog.streams():
            try:
                self._supervise(record)
            except Exception as error:  # a stream's failure must not stop the others
                self._fail(record.definition.name, "*", error)

    def shutdown(self) -> None:
        for worker in self.workers.values():
            if worker.query is not None and worker.query.isActive:
                worker.query.stop()
            if worker.thread is not None:
                worker.thread.join(timeout=60)
        self.workers.clear()

    def _supervise(self, record: StreamRecord) -> None:
        name = record.definition.name
        worker = self.workers.setdefault(name, Worker(name))
        if worker.thread is not None and worker.thread.is_alive():
            return
        match record.state:
            case StreamState.STARTING:
                worker.thread = threading.Thread(target=self._start, args=(record,), daemon=True)
                worker.thread.start()
            case StreamState.RUNNING:
                if worker.query is None or not worker.query.isActive:
                    if worker.query is not None and worker.query.exception() is not None:
                        raise RuntimeError(str(worker.query.exception()))
                    worker.query = self._query(record, drain=False)
            case StreamState.DRAINING:
                worker.thread = threading.Thread(target=self._drain, args=(record,), daemon=True)
                worker.thread.start()
            case StreamState.FAILED:
                self._stop_query(worker)
                if record.retries >= self.max_retries:
                    self.catalog.act(name, "give_up")
                elif time.time() - record.changed >= self.backoff_seconds * 2 ** record.retries:
                    self.catalog.act(name, "retry")
            case _:
                self._stop_query(worker)

    def _stop_query(self, worker: Worker) -> None:
        if worker.query is not None and worker.query.isActive:
            worker.query.stop()
        worker.query = None

    def _fail(self, name: str, object_name: str, error: BaseException) -> None:
        message = f"{type(error).__name__}: {error}"
        self.catalog.record_error(name, object_name, message[:2000])
        try:
            self.catalog.act(name, "fail")
        except Exception:
            traceback.print_exc()

    # ---- starting and backfill ------------------------------------------------------------

    def _tables(self, record: StreamRecord) -> tuple[Database, list[str], dict[str, Path]]:
        definition = record.definition
        db = Database.open(definition.source.database, create=False)
        stream = db.change_stream(definition.source.change_stream)
        objects = [t for t in db.tables() if stream.watches(t) and definition.selects(t)]
        destination = cdc_destination(definition)
        tables: dict[str, Path] = {}
        if destination is not None:
            staleness = destination.max_staleness_seconds
            created = ensure_tables(db, definition.source.change_stream, destination.warehouse,
                                    None if staleness is None else timedelta(seconds=staleness))
            tables = {k: v for k, v in created.items() if k in objects}
        return db, objects, tables

    def _start(self, record: StreamRecord) -> None:
        name = record.definition.name
        try:
            db, objects, tables = self._tables(record)
            status = self.catalog.status(name)
            if "cdc_start" not in status:
                snapshot = db.current_timestamp()
                if record.definition.backfill == "all":
                    self._backfill(record, db, objects, tables, snapshot)
                self.catalog.update_status(name, cdc_start=to_micros(snapshot) + 1,
                                           objects=objects)
            self.catalog.act(name, "started")
        except Exception as error:
            self._fail(name, "*", error)

    def _backfill(self, record: StreamRecord, db: Database, objects: list[str],
                  tables: dict[str, Path], snapshot: datetime) -> None:
        """Each object from one consistent snapshot at `snapshot` (EV: backfill + CDC)."""
        name = record.definition.name
        progress = {o: {"state": "PENDING", "rows": 0} for o in objects}
        self.catalog.update_status(name, backfill=progress)
        plan = BatchPlan.of(record.definition, objects, tables)
        writer = plan.writer()
        for table in objects:
            progress[table] = {"state": "RUNNING", "rows": 0}
            self.catalog.update_status(name, backfill=progress)
            rows = db.scan(table, read_timestamp=snapshot)
            schema = db.table_schema(table)
            if table in tables:
                target = CdcTable.open(tables[table])
                columns = target.schema.names
                data = pa.Table.from_pylist([{c: r[c] for c in columns} for r in rows],
                                            schema=target.schema)
                target.connection().append(data, app_id=f"stream:{name}:backfill", version=0)
            if writer is not None:
                types = tuple(ColumnTypeInfo(c.name, c.type, c.name in schema.primary_key,
                                             schema.ordinal(c.name)) for c in schema.columns)
                now = datetime.now(UTC)
                events = [backfill_event(name, plan.database, table, types, r, snapshot, now)
                          for r in rows]
                writer.write_batch(f"backfill-{table}-{to_micros(snapshot)}", events)
            progress[table] = {"state": "COMPLETED", "rows": len(rows)}
            self.catalog.update_status(name, backfill=progress)

    # ---- the streaming query --------------------------------------------------------------

    def _query(self, record: StreamRecord, drain: bool) -> Any:
        definition = record.definition
        name = definition.name
        db, objects, tables = self._tables(record)
        status = self.catalog.status(name)
        plan = BatchPlan.of(definition, objects, tables)
        start = format_rfc3339(from_micros(int(status["cdc_start"])))
        reader = (self.spark.readStream.format("cdcflow")
                  .option("database", definition.source.database)
                  .option("stream", definition.source.change_stream)
                  .option("startingTimestamp", start))
        if definition.spark.max_records_per_trigger:
            reader = reader.option("maxRecordsPerTrigger", definition.spark.max_records_per_trigger)
        worker = self.workers[name]
        for key in ("rows_processed", "batches", "last_applied_commit"):
            if status.get(key) is not None and key not in worker.stats:
                worker.stats[key] = status[key]  # counters go on across runner restarts

        def batch(frame: Any, batch_id: int) -> None:
            result = run_batch(plan, frame, batch_id)
            self._record_progress(name, db, definition.source.change_stream, result, worker)

        writer = (reader.load().writeStream.foreachBatch(batch)
                  .option("checkpointLocation", str(self.home / "checkpoints" / name)))
        if drain:
            return writer.trigger(availableNow=True).start()
        return writer.trigger(processingTime=f"{definition.spark.trigger_seconds} seconds").start()

    def _record_progress(self, name: str, db: Database, change_stream: str,
                         result: dict[str, Any], worker: Worker) -> None:
        stats = worker.stats
        stats["rows_processed"] = stats.get("rows_processed", 0) + result["rows"]
        stats["batches"] = stats.get("batches", 0) + 1
        if result["last_micros"] is not None:
            stats["last_applied_commit"] = result["last_micros"]
        now = to_micros(datetime.now(UTC))
        lag = (now - stats["last_applied_commit"]) / 1e6 if "last_applied_commit" in stats else None
        rate = result["rows"] / result["seconds"] if result["seconds"] else 0.0
        lags = stats.setdefault("lags", [])
        if lag is not None and result["rows"]:
            lags.append(lag)
            del lags[:-1000]
        active = sum(p.state == "ACTIVE" for p in db.partitions(change_stream))
        self.catalog.update_status(
            name, rows_processed=stats["rows_processed"], batches=stats["batches"],
            lag_seconds=lag, throughput_rows_per_second=rate, partitions=active,
            last_applied_commit=stats.get("last_applied_commit"), lag_samples=lags[-200:])

    def _drain(self, record: StreamRecord) -> None:
        name = record.definition.name
        worker = self.workers[name]
        try:
            self._stop_query(worker)
            query = self._query(record, drain=True)
            worker.query = query
            query.awaitTermination()
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            worker.query = None
            self.catalog.act(name, "drained")
        except Exception as error:
            self._fail(name, "*", error)
