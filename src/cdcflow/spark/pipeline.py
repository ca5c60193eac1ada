"""The batch pipeline: change-log micro-batches into CDC tables and event files, exactly once.

One pipeline serves the runner's streams and `apply_change_stream`. A micro-batch of the
"cdcflow" source is repartitioned by (table, keys); executors fold each key's mods onto the
key's row (`cdcflow.table.fold`), write CDC-table pending files and event files, and describe
what they wrote; the driver writes the event batch manifest, then commits each CDC table
with the (app id, batch id) app transaction. A replayed batch id changes nothing.

This module imports no pyspark at import time (the runner imports it); Spark objects arrive
as arguments.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa

from cdcflow.clock import SYSTEM_CLOCK
from cdcflow.events.files import EventFileWriter, Rotation
from cdcflow.model.collector import collector_paused
from cdcflow.model.events import change_of_row, event_of_change
from cdcflow.model.timestamps import to_micros
from cdcflow.spark.driver_batch import DriverReader
from cdcflow.spark.keyed_batch import mods_of_share, run_keyed, share_count
from cdcflow.spark.options import parse_options
from cdcflow.spark.queries import remove_unfinished_writes
from cdcflow.spark.reading import ChangeSlice
from cdcflow.spark.rows import batch_dicts
from cdcflow.spark.worker_heap import settle_task_heap
from cdcflow.store.database import Database
from cdcflow.table import CdcTable
from cdcflow.table.arrow_types import arrow_type, fields_from_json, fields_to_json
from cdcflow.table.fold import added_fields, fold_mods, pending_rows
from cdcflow.table.pending import (
    PendingLogs,
    applied_version,
    commit_pending_files,
    ingest_stamp,
    write_pending_file,
)
from cdcflow.table.writers import TableWriter, claim_tables

OUT_SCHEMA = ("kind STRING, table_root STRING, path STRING, size BIGINT, rows BIGINT, "
              "files STRING, events BIGINT, last_micros BIGINT, added STRING")


@dataclass(frozen=True, slots=True)
class EventsPlan:
    root: str
    format: str
    rotation: Rotation


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """Everything executors need, picklable. `tables` maps each object to the CDC table that
    holds its rows: a destination, or the stream's own row state when the stream has no
    CDC-table destination (events need the whole row either way, EV-5)."""

    stream: str
    source_label: str
    objects: tuple[str, ...]
    tables: dict[str, str]
    app_id: str
    events: EventsPlan | None = None
    driver_rows: int = 20_000
    """A batch of at most this many mods is folded and written on the driver: no shuffle,
    no second stage (0: every batch goes through the executors)."""
    first_event_batch: int = 0
    """The number Spark's batch 0 has in the event manifests: 0 but for a stream created
    again under the name of one whose manifests its event root holds, which numbers its
    batches on from those (`cdcflow.streams.setup.start_afresh`)."""

    def writer(self) -> EventFileWriter | None:
        if self.events is None:
            return None
        return EventFileWriter(self.events.root, self.stream, self.events.format,
                               self.events.rotation)


def _micros(stamp: datetime) -> int:
    """Micros of a commit timestamp as Arrow gives it (UTC; naive from some readers)."""
    return to_micros(stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC))


def _out(kind: str, **values: Any) -> dict[str, Any]:
    return {"kind": kind, "table_root": "", "path": "", "size": 0, "rows": 0, "files": "",
            "events": 0, "last_micros": 0, "added": fields_to_json([])} | values


@dataclass(frozen=True, slots=True)
class BatchWork:
    """What every task of one attempt at a batch shares: the batch, which destinations it
    still writes, its events' read time (None: now) and the layout of its parts, named in
    the event files (`EventFileWriter.write_part`): "driver", "keyed<shares>" or
    "hashed<partitions>". Two attempts laid out alike write the same parts."""

    batch_id: int
    write_tables: bool = True
    write_events: bool = True
    read_at: datetime | None = None
    layout: str = ""


def process_partition(plan: BatchPlan, work: BatchWork, batches: Iterator[pa.RecordBatch]
                      ) -> Iterator[pa.RecordBatch]:
    """Executor side: fold, write pending files and event files (those of the destinations
    not yet committed for this batch), describe what was written. The batch's objects form
    no cycles: the cyclic collector is paused meanwhile (`cdcflow.model.collector`)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    part = context.partitionId() if context is not None else 0
    settle_task_heap()
    with collector_paused():
        out = _write_partition(plan, work, part, [m for b in batches for m in batch_dicts(b)])
    if out:
        yield pa.RecordBatch.from_pylist(out)


def _share_work(plan: BatchPlan, work: BatchWork, share: int, shares: int,
                pieces: list[ChangeSlice], owners: dict[str, int] | None
                ) -> list[dict[str, Any]]:
    """Executor side of a keyed batch: the mods of one share of the keys, read from the
    pieces, folded and written as `process_partition` does (the share is the part)."""
    settle_task_heap()
    with collector_paused():
        mods = mods_of_share(pieces, share, shares, owners)
        return _write_partition(plan, work, share, mods)


def _write_partition(plan: BatchPlan, work: BatchWork, part: int, rows: list[dict[str, Any]]
                     ) -> list[dict[str, Any]]:
    mods = [m for m in rows if m["table_name"] in plan.objects]
    if not mods:
        return []
    tables: dict[str, CdcTable | None] = {
        name: CdcTable.open(plan.tables[name]) if name in plan.tables else None
        for name in plan.objects}
    present = {m["table_name"] for m in mods}
    schemas = {name: table.schema for name, table in tables.items()
               if table is not None and name in present}  # one Delta read per table
    folded = fold_mods(tables, mods, schemas)
    last = max(_micros(m["commit_timestamp"]) for m in mods)
    out: list[dict[str, Any]] = []
    stamp = ingest_stamp(SYSTEM_CLOCK)
    for name, table in tables.items():
        mine = [f for f in folded if f.table == name]
        if work.write_tables and table is not None and mine and table.primary_key:
            added = added_fields(schemas[name], mine)
            described = write_pending_file(plan.tables[name], pending_rows(
                table, schemas[name], mine, stamp, added))
            out.append(_out("cdc", **described, last_micros=last,
                            added=fields_to_json(added)))
    writer = plan.writer()
    if writer is not None and work.write_events:
        now = work.read_at or SYSTEM_CLOCK.now()
        events = [event_of_change(plan.stream, plan.source_label, change_of_row(mod), row, now)
                  for item in folded for mod, row in zip(item.mods, item.rows, strict=True)]
        files = writer.write_part(plan.first_event_batch + work.batch_id, part, events,
                                  work.layout)
        out.append(_out("events", files=json.dumps(files), events=len(events),
                        last_micros=last))
    out.append(_out("count", rows=len(mods), last_micros=last))
    return out


def _committed(root: str, app_id: str, batch_id: int, logs: PendingLogs) -> bool:
    version = applied_version(root, app_id, logs)
    return version is not None and version >= batch_id


def run_batch(plan: BatchPlan, frame: Any, batch_id: int,
              driver: DriverReader | None = None, logs: PendingLogs | None = None
              ) -> dict[str, Any]:
    """Driver side of one batch; returns counters: rows, seconds, last commit micros.

    The event manifest commits before the tables: a replay after a crash between the two
    writes no events and folds the table rows again from the tables as they were before the
    batch. (Tables first would fold the replay's events onto the rows after the batch.)

    Every attempt at a batch writes the same event files, byte for byte: its events are read
    at the time Spark logged for the batch (`DriverReader.read_time`), and Avro files take
    their sync marker from their name. A writer its killed driver left running may still
    replace a file after the manifest lists it, and the file must stay the one listed."""
    began = time.monotonic()
    logs = logs or PendingLogs()
    writer = plan.writer()
    event_batch = plan.first_event_batch + batch_id
    cdc_done = not logs.ran_before(batch_id) and all(
        _committed(root, plan.app_id, batch_id, logs) for root in plan.tables.values())
    events_done = writer is None or writer.is_committed(event_batch)
    if cdc_done and events_done:
        return {"rows": 0, "seconds": 0.0, "last_micros": None}
    read_at = (driver.read_time(batch_id) if driver is not None else None) or SYSTEM_CLOCK.now()
    written = _written(plan, frame, BatchWork(batch_id, not cdc_done, not events_done, read_at),
                       driver)
    if writer is not None and not events_done:
        files = [f for w in written if w["kind"] == "events" for f in json.loads(w["files"])]
        writer.commit_batch(event_batch, files)
    elif writer is not None:  # a replay: the attempt that committed may have stopped there
        writer.remove_leftovers(event_batch)
    for root in plan.tables.values():
        mine = [w for w in written if w["kind"] == "cdc" and w["table_root"] == root]
        if not mine:
            continue  # nothing of this table in the batch: no commit (see PendingLogs.ran)
        added = [f for w in mine for f in fields_from_json(w["added"])]
        if added:
            CdcTable.open(root).add_columns(added)  # before the files that hold them commit
        commit_pending_files(root, mine, plan.app_id, batch_id, SYSTEM_CLOCK, logs)
    logs.ran(batch_id)
    lasts = [w["last_micros"] for w in written if w["last_micros"]]
    return {"rows": sum(w["rows"] for w in written if w["kind"] == "count"),
            "seconds": time.monotonic() - began, "last_micros": max(lasts) if lasts else None}


def _written(plan: BatchPlan, frame: Any, work: BatchWork, driver: DriverReader | None
             ) -> list[dict[str, Any]]:
    """Fold and write a batch; the descriptions of what was written. A small batch (at most
    `plan.driver_rows` mods) is done on the driver in one piece: every key's mods are in it
    (the fold orders them). It is read from the log by `driver` when it can, else by one
    Spark read. A larger one is done by the executors (the driver tells it is larger by
    counting its mods in the log, without reading it): in shares of the keys, each task
    reading the batch from the log itself (`keyed_batch`), or, with more task slots or no
    offsets logged, repartitioned by (table, keys)."""
    pieces = driver.slices(work.batch_id) if driver is not None else None
    counting = driver if driver is not None and plan.driver_rows > 0 else None
    counts = counting.mod_counts(pieces) if counting is not None and pieces else None
    small = counting.read_slices(pieces, counts) if counting is not None else None
    if small is None and plan.driver_rows > 0:  # not known from the log: ask Spark
        table = frame.limit(plan.driver_rows + 1).toArrow()
        small = table.to_batches() if table.num_rows <= plan.driver_rows else None
    if isinstance(small, list):
        return [row for batch in process_partition(
            plan, replace(work, layout="driver"), iter(small)) for row in batch.to_pylist()]
    shares = share_count(frame.sparkSession.sparkContext.defaultParallelism)
    if pieces is not None and shares is not None:  # no row through the JVM: `keyed_batch`
        keyed = replace(work, layout=f"keyed{shares}")
        return run_keyed(frame.sparkSession, pieces, shares, partial(_share_work, plan, keyed),
                         counts)
    # as many partitions as the query's shuffles (kept in its checkpoint), named in the
    # files; no sort within them: the fold puts each key's mods in log order itself
    count = int(frame.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    hashed = replace(work, layout=f"hashed{count}")
    arranged = frame.repartition(count, "table_name", "keys")
    return [r.asDict() for r in arranged.mapInArrow(
        lambda it: process_partition(plan, hashed, it), OUT_SCHEMA).collect()]


def start_query(spark: Any, plan: BatchPlan, log_path: str, change_stream: str,
                starting: str, checkpoint: str | Path, trigger: dict[str, Any],
                max_records: int | None = None,
                on_batch: Callable[[dict[str, Any]], None] | None = None,
                control: str | None = None, segment_root: str | None = None) -> Any:
    """Start the streaming query of a plan over a change log; returns the StreamingQuery.
    `trigger` is a writeStream trigger (e.g. {"processingTime": "1 second"},
    {"availableNow": True}); `on_batch` sees each batch's counters; `control` is the path of
    the query's control file, to stop it between batches (`cdcflow.spark.queries`);
    `segment_root`, a folder every executor reaches where the driver seals the log's slices
    for them (clusters: `cdcflow.store.segments`)."""
    options = {"database": log_path, "stream": change_stream, "startingTimestamp": starting}
    if max_records:
        options["maxRecordsPerTrigger"] = str(max_records)
    if control:
        options["controlPath"] = control
    if segment_root:
        options["segmentRoot"] = segment_root
    reader = spark.readStream.format("cdcflow").options(**options)
    driver = DriverReader(str(checkpoint), parse_options(options), plan.driver_rows)
    logs = PendingLogs()

    def batch(frame: Any, batch_id: int) -> None:
        result = run_batch(plan, frame, batch_id, driver, logs)
        if on_batch is not None:
            on_batch(result | {"batch_id": batch_id})

    remove_unfinished_writes(checkpoint)  # a killed query's half-written log entries
    event_writer = plan.writer()
    if event_writer is not None:  # and its half-written event manifests
        event_writer.remove_unfinished_manifests()
    writer = (reader.load().writeStream.foreachBatch(batch)
              .option("checkpointLocation", str(checkpoint)))
    return writer.trigger(**trigger).start()


def _embedded_tables(database: Database, stream: str, warehouse: str | Path,
                     max_staleness: timedelta | None, writer: TableWriter) -> dict[str, str]:
    """A CdcTable per table the stream watches (keys + watched columns), created if missing;
    `writer` is the change stream as the tables' writer."""
    definition = database.change_stream(stream)
    roots = {}
    watched = [name for name in database.tables() if definition.watches(name)]
    claim_tables(writer, {name: Path(warehouse) / name for name in watched})
    for name in watched:
        schema = database.table_schema(name)
        columns = set(definition.watched_columns(schema)) | set(schema.primary_key)
        fields = [pa.field(c.name, arrow_type(c.type), not c.not_null)
                  for c in schema.columns if c.name in columns]
        table = CdcTable.ensure(Path(warehouse) / name, pa.schema(fields),
                                list(schema.primary_key), max_staleness=max_staleness)
        roots[name] = str(table.root.resolve())
    return roots


def embedded_writer(database: str, stream: str) -> TableWriter:
    """Change stream `stream` of the database at `database` as a writer of CDC tables."""
    return TableWriter(f"change-stream:{Path(database).resolve()}:{stream}",
                       f"change stream {stream!r} of {database!r}",
                       "give the change stream a warehouse of its own")


def apply_change_stream(
    spark: Any,
    database: str,
    stream: str,
    warehouse: str | Path,
    checkpoint: str | Path,
    starting_timestamp: str = "earliest",
    max_staleness: timedelta | None = None,
    trigger: dict[str, Any] | None = None,
    max_records_per_trigger: int | None = None,
    segment_root: str | None = None,
    on_batch: Callable[[dict[str, Any]], None] | None = None,
) -> Any:
    """Start a streaming query that keeps one CDC table per watched table equal to the source.

    Tables live at `<warehouse>/<table>`. Returns the StreamingQuery. Apply jobs run by
    `CdcTable.apply()` or `start_background_apply()`; reads merge pending changes anyway.
    On a cluster, give `segment_root` (a folder every executor reaches, one per query) and
    put the warehouse where every executor reaches it too (README "Running on a cluster").
    `on_batch` sees each batch's counters (`rows`, `seconds`, `last_micros`, `batch_id`):
    Spark's own progress counts no input row for a batch whose tasks read the log themselves
    (`keyed_batch`).
    """
    db = Database.open(database, create=False)
    writer = embedded_writer(database, stream)
    roots = _embedded_tables(db, stream, warehouse, max_staleness, writer)
    plan = BatchPlan(stream, database, tuple(roots), roots, writer.writer)
    return start_query(spark, plan, database, stream, starting_timestamp, checkpoint,
                       trigger or {"processingTime": "1 second"}, max_records_per_trigger,
                       on_batch, segment_root=segment_root)
