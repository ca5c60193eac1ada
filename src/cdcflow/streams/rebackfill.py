"""Backfilling one object of a running stream again (`cdcflow streams backfill NAME OBJECT`).

The request goes into the stream's status in the catalog (`backfill_request`). The capture
worker serves it in chunks between watermarks while streaming goes on and reports its progress
(`backfill_again`: id, object, chunks, rows, done, and `since`, the log time it began at).
Every row the source still has is then written again at or after `since`; once the stream's
query has committed the last chunk, the runner deletes from the object's table the rows whose
latest change is older (`CdcTable.delete_older_than`): rows the source lost without the table
hearing of it, as a TRUNCATE leaves them. That sweep is recorded as `backfill_swept`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdcflow.errors import FailedPrecondition, InvalidArgument
from cdcflow.model.sequence import ChangeSequenceNumber
from cdcflow.model.timestamps import to_micros
from cdcflow.store.changelog import open_log
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import MySqlSource, PostgresSource
from cdcflow.streams.setup import StreamSetup
from cdcflow.streams.sources import open_source
from cdcflow.streams.workers import (
    BACKFILL_PROGRESS,
    BACKFILL_QUEUE,
    BACKFILL_REQUEST,
    BACKFILL_SWEPT,
    backfill_busy,
)
from cdcflow.table import CdcTable

REQUEST, PROGRESS, SWEPT, QUEUE = (BACKFILL_REQUEST, BACKFILL_PROGRESS, BACKFILL_SWEPT,
                                   BACKFILL_QUEUE)


def request_backfill(catalog: Catalog, name: str, object_name: str) -> dict[str, Any]:
    """Ask the stream `name` to backfill `object_name` again; return the request.

    The object must be one the stream selects, with a primary key (its own or one the
    definition names), and no other backfill of the stream may be under way."""
    record = catalog.get(name)
    definition = record.definition
    if not isinstance(definition.source, PostgresSource | MySqlSource):
        raise FailedPrecondition(
            f"stream {name!r} reads a {definition.source.kind} source; backfilling one object "
            "again while the stream goes on needs a source with a capture worker (postgres, "
            "mysql)")
    if not definition.selects(object_name):
        raise InvalidArgument(f"object {object_name!r} is not selected by stream {name!r} "
                              f"(include {list(definition.include)}, exclude "
                              f"{list(definition.exclude)})")
    home = Path(catalog.path).resolve().parent
    source = open_source(definition, home)
    try:
        found = {o.name: o for o in source.discover()}
    finally:
        source.close()
    if object_name not in found:
        raise InvalidArgument(f"object {object_name!r} does not exist in the source of "
                              f"stream {name!r}")
    if not found[object_name].primary_key:
        raise InvalidArgument(
            f"object {object_name!r} has no primary key: backfilling it again while the stream "
            "goes on reads it in key order; name its key columns under primary_keys")
    status = catalog.status(name)
    busy = backfill_busy(status) or (
        f"has {len(status[QUEUE])} objects queued to backfill again" if status.get(QUEUE)
        else None)
    if busy is not None:
        raise FailedPrecondition(f"stream {name!r} {busy}; a new request can follow when it "
                                 "is done (the runner must be running)")
    request = {"id": uuid.uuid4().hex, "object": object_name}
    catalog.update_status(name, **{REQUEST: request})
    return request


@dataclass(slots=True)
class Sweeper:
    """The runner's side: sweep an object's table once its backfill is done and applied."""

    catalog: Catalog
    marks: dict[str, int] = field(default_factory=dict)
    """request id -> the log's time when the runner first saw it done."""

    def sweep_due(self, setup: StreamSetup, committed: int | None) -> int | None:
        """Sweep if the request served is done and the stream's query has committed the log
        up to `committed` (micros) past its end; return the rows deleted, None if not due."""
        name = setup.definition.name
        status = self.catalog.status(name)
        progress = status.get(PROGRESS)
        if not progress or not progress.get("done") or progress.get("failed") or \
                (status.get(SWEPT) or {}).get("id") == progress["id"]:
            return None
        log_path, _ = setup.source.log_location()
        if progress["id"] not in self.marks:
            self.marks[progress["id"]] = to_micros(open_log(log_path).current_timestamp())
        mark = self.marks[progress["id"]]
        if committed is None or committed < mark:
            return None
        root = setup.tables.get(progress["object"])
        deleted = 0 if root is None else CdcTable.open(root).delete_older_than(
            str(ChangeSequenceNumber.from_ints(int(progress["since"]))))
        self.catalog.update_status(name, **{SWEPT: {"id": progress["id"],
                                                   "object": progress["object"],
                                                   "rows_deleted": deleted}})
        return deleted
