"""Backfill (EV: backfill + CDC): every object from one consistent snapshot into the stream's
tables and event files, then CDC from the snapshot's `cdc_start`, with no gap and no duplicate
in effect.

The snapshot and each object's progress are kept in the stream's status: after every chunk,
the chunk's number and the resume token after it. Every chunk is written idempotently (a
table append carries (backfill id, chunk number); an event batch is named after the chunk), so
a backfill cut short goes on after its last chunk and writes none twice.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pyarrow as pa

from cdcflow.capture.source import SourceObject
from cdcflow.clock import Clock
from cdcflow.model.events import backfill_event
from cdcflow.model.timestamps import format_rfc3339, parse_timestamp, to_micros
from cdcflow.streams.catalog import Catalog, StreamGone
from cdcflow.streams.setup import StreamSetup
from cdcflow.table import CdcTable


class BackfillSink:
    """Receives snapshot chunks; writes them to the object's table and to event files, then
    records the chunk as done."""

    def __init__(self, setup: StreamSetup, catalog: Catalog, snapshot: datetime,
                 progress: dict[str, dict[str, Any]], clock: Clock) -> None:
        self.setup, self.catalog, self.snapshot, self.clock = setup, catalog, snapshot, clock
        self.key = str(to_micros(snapshot))
        self.progress = {name: progress.get(name) or {"state": "PENDING", "rows": 0,
                                                       "chunks": 0, "after": None}
                         for name in setup.objects}
        self.writer = setup.plan.writer()

    def resume(self) -> dict[str, Any]:
        """Per object: "done", or the token after its last chunk."""
        return {name: "done" if p["state"] == "COMPLETED" else p.get("after")
                for name, p in self.progress.items()}

    def __call__(self, item: SourceObject, rows: list[dict[str, Any]], after: Any) -> None:
        name, setup = item.name, self.setup
        self.catalog.check_scope()  # a stream deleted meanwhile writes no more chunks
        chunk = int(self.progress[name].get("chunks", 0))
        if name in setup.tables:
            table = CdcTable.open(setup.tables[name], clock=self.clock)
            data = pa.Table.from_pylist(rows, schema=table.schema)
            table.connection().append(data, app_id=f"backfill:{self.key}:{name}",
                                      version=chunk)
        if self.writer is not None:
            now = self.clock.now()
            events = [backfill_event(setup.definition.name, setup.plan.source_label, name,
                                     item.column_types(), row, self.snapshot, now,
                                     setup.source.kind) for row in rows]
            self.writer.write_batch(f"backfill-{name}-{self.key}-{chunk:06d}", events)
        self.progress[name] = {"state": "RUNNING", "chunks": chunk + 1, "after": after,
                               "rows": self.progress[name]["rows"] + len(rows)}
        self.catalog.update_status(setup.definition.name, backfill=self.progress)

    def completed(self) -> None:
        for name, state in self.progress.items():
            self.progress[name] = state | {"state": "COMPLETED"}
        self.catalog.update_status(self.setup.definition.name, backfill=self.progress)


def run_backfill(setup: StreamSetup, catalog: Catalog, clock: Clock) -> None:
    """Backfill every object (when the definition asks for it), record where CDC starts."""
    name = setup.definition.name
    status = catalog.status(name)
    objects = list(setup.objects.values())
    snapshot = setup.source.snapshot(objects, status.get("snapshot"))
    when = status.get("snapshot_time")  # the first attempt's: chunk names stay the same
    first = snapshot.read_timestamp if when is None else parse_timestamp(when)
    try:
        catalog.update_status(name, snapshot=snapshot.position,
                              snapshot_time=format_rfc3339(first))
        if setup.definition.backfill == "all":
            sink = BackfillSink(setup, catalog, first, status.get("backfill") or {}, clock)
            catalog.update_status(name, backfill=sink.progress)
            setup.source.backfill(snapshot, objects, sink, sink.resume())
            sink.completed()
        catalog.update_status(name, cdc_start=to_micros(snapshot.cdc_start),
                              objects=sorted(setup.objects))
    except StreamGone:  # deleted meanwhile: nothing will resume this snapshot
        setup.source.release(snapshot)
        raise
    setup.source.release(snapshot)
