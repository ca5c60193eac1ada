"""What one micro-batch of a stream does: fold each key's mods (whole rows), write CDC-table
pending files and event files from the executors, then commit both from the driver, exactly
once per batch id: the CDC commits carry (stream, batch id) app transactions and the event
batch manifest is written last."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from cdcflow.events.files import EventFileWriter, Rotation
from cdcflow.model.events import event_from_mod
from cdcflow.model.timestamps import to_micros
from cdcflow.spark.pipeline import fold_mods, pending_rows
from cdcflow.spark.rows import record_from_row
from cdcflow.spark.sink import commit_pending_files, write_pending_file
from cdcflow.streams.definition import CdcTableDestination, EventFilesDestination
from cdcflow.streams.definition import StreamDefinition as Definition
from cdcflow.table import CdcTable
from cdcflow.table.pending import applied_version

OUT_SCHEMA = ("kind STRING, table_root STRING, path STRING, size BIGINT, rows BIGINT, "
              "files STRING, events BIGINT, last_micros BIGINT")


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """Everything executors need, picklable: the stream, table roots, event destination."""

    stream: str
    database: str
    objects: tuple[str, ...]
    tables: dict[str, str]
    events_root: str | None
    events_format: str
    rotation: Rotation

    @staticmethod
    def of(definition: Definition, objects: list[str], tables: dict[str, Path]) -> BatchPlan:
        files = [d for d in definition.destinations if isinstance(d, EventFilesDestination)]
        first = files[0] if files else None
        return BatchPlan(
            definition.name, definition.source.database, tuple(objects),
            {name: str(root.resolve()) for name, root in tables.items()},
            None if first is None else first.root,
            "json" if first is None else first.format,
            Rotation() if first is None else Rotation(first.max_events, first.max_bytes,
                                                      first.max_seconds),
        )

    def writer(self) -> EventFileWriter | None:
        if self.events_root is None:
            return None
        return EventFileWriter(self.events_root, self.stream, self.events_format, self.rotation)


def cdc_destination(definition: Definition) -> CdcTableDestination | None:
    found = [d for d in definition.destinations if isinstance(d, CdcTableDestination)]
    return found[0] if found else None


def process_partition(plan: BatchPlan, batch_id: int,
                      batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Executor side: fold, write pending files and event files, describe what was written."""
    from pyspark import TaskContext

    mods = [m for b in batches for m in b.to_pylist() if m["table_name"] in plan.objects]
    if not mods:
        return
    context = TaskContext.get()
    part = context.partitionId() if context is not None else 0
    tables: dict[str, CdcTable | None] = {
        name: CdcTable.open(plan.tables[name]) if name in plan.tables else None
        for name in plan.objects}
    folded = fold_mods(tables, mods)
    out: list[dict[str, Any]] = []
    last = max(to_micros(_aware(m["commit_timestamp"])) for m in mods)
    for name, table in tables.items():
        mine = [f for f in folded if f.table == name]
        if table is not None and mine:
            described = write_pending_file(plan.tables[name], pending_rows(table, mine))
            out.append({"kind": "cdc", **described, "files": "", "events": 0,
                        "last_micros": last})
    writer = plan.writer()
    if writer is not None:
        now = datetime.now(UTC)
        events = [event_from_mod(plan.stream, plan.database, record_from_row(mod), 0, row, now,
                                 mod["partition_token"])
                  for item in folded for mod, row in zip(item.mods, item.rows, strict=True)]
        events = [_with_index(e, mod) for e, mod in zip(
            events, [m for item in folded for m in item.mods], strict=True)]
        files = writer.write_part(batch_id, part, events)
        out.append({"kind": "events", "table_root": "", "path": "", "size": 0, "rows": 0,
                    "files": json.dumps(files), "events": len(events), "last_micros": last})
    out.append({"kind": "count", "table_root": "", "path": "", "size": 0, "rows": len(mods),
                "files": "", "events": 0, "last_micros": last})
    yield pa.RecordBatch.from_pylist(out)


def _aware(stamp: datetime) -> datetime:
    return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)


def _with_index(event: Any, mod: dict[str, Any]) -> Any:
    """Events from single-mod records: restore the mod's index in its record (uuid, sort)."""
    from dataclasses import replace

    from cdcflow.model.events import change_uuid

    index = int(mod["mod_index"])
    return replace(
        event,
        uuid=change_uuid(event.stream_name, event.object, mod["server_transaction_id"],
                         mod["record_sequence"], index),
        sort_keys=(*event.sort_keys[:3], index),
    )


def run_batch(plan: BatchPlan, frame: Any, batch_id: int) -> dict[str, Any]:
    """Driver side of one batch; returns counters for the stream's status."""
    began = time.monotonic()
    writer = plan.writer()
    app_id = f"stream:{plan.stream}"
    cdc_done = all((applied_version(root, app_id) or -1) >= batch_id
                   for root in plan.tables.values())
    events_done = writer is None or writer.is_committed(batch_id)
    if cdc_done and events_done:
        return {"rows": 0, "seconds": 0.0, "last_micros": None}
    arranged = frame.repartition("table_name", "keys")
    written = [r.asDict() for r in arranged.mapInArrow(
        lambda it: process_partition(plan, batch_id, it), OUT_SCHEMA).collect()]
    for root in plan.tables.values():
        mine = [w for w in written if w["kind"] == "cdc" and w["table_root"] == root]
        commit_pending_files(root, mine, app_id, batch_id)
    events = sum(w["events"] for w in written if w["kind"] == "events")
    if writer is not None and not events_done:
        files = [f for w in written if w["kind"] == "events" for f in json.loads(w["files"])]
        writer.commit_batch(batch_id, files)
    rows = sum(w["rows"] for w in written if w["kind"] == "count")
    del events
    lasts = [w["last_micros"] for w in written]
    return {"rows": rows, "seconds": time.monotonic() - began,
            "last_micros": max(lasts) if lasts else None}
