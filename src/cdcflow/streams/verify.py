"""`cdcflow verify`: compare every object of a stream with its CDC table and its event files.

Where the sides can be compared: at a point where the stream has written everything up to
a known place. Verify therefore works on a drained stream. A RUNNING stream is drained first
(and resumed after); a PAUSED one that was not drained is resumed and drained (and left
PAUSED); a stream whose last drain is still its state is verified as it is. The runner
(`cdcflow run`) does the draining, so it must be running for the first two.

- The embedded database keeps row versions: it is read at the drain's log time, so writers
  may go on meanwhile.
- PostgreSQL, MySQL and the watcher are read as they are now: the comparison is valid when
  nothing wrote to the objects since the drain (a quiet point), and the report says so.

Both sides are compared by per-bucket digests first and row by row only in the buckets
that differ (`cdcflow.streams.compare`), so memory stays bounded on large tables.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

from cdcflow.capture.embedded import EmbeddedSource as EmbeddedChangeSource
from cdcflow.capture.source import ChangeSource, SourceObject
from cdcflow.errors import CdcflowError, FailedPrecondition, NotFound
from cdcflow.model.timestamps import format_rfc3339, from_micros
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.compare import Canonical, Canonicalizer, Digest, compare, digest
from cdcflow.streams.definition import (
    CdcTableDestination,
    StreamDefinition,
)
from cdcflow.streams.sources import open_source
from cdcflow.streams.states import StreamState
from cdcflow.streams.verify_read import EventRows, groups_for, source_rows, table_rows
from cdcflow.table import CdcTable

VERSIONS_KEPT = timedelta(minutes=55)
"""Reads at a timestamp older than the embedded database's version retention (1 hour)
fail; verify then reads the source as it is now."""


@dataclass(frozen=True, slots=True)
class DrainedAt:
    how: str
    through: int
    """The log time (micros) the drain reached."""


def verify(catalog: Catalog, name: str, object_name: str | None = None,
           wait_seconds: float = 600.0) -> dict[str, Any]:
    """The report: per object, row counts and the differences of each destination."""
    began = time.monotonic()
    record = catalog.get(name)
    drained = settle(catalog, name, wait_seconds)
    source = open_source(record.definition, Path(catalog.path).resolve().parent)
    try:
        objects = _objects(source, record.definition, object_name)
        at = from_micros(drained.through) if isinstance(source, EmbeddedChangeSource) else None
        if at is not None and catalog.clock.now() - at > VERSIONS_KEPT:
            at, drained = None, DrainedAt(drained.how + "; the drain is older than the "
                                          "embedded database keeps row versions", 0)
        reports = [verify_object(record.definition, source, item, at) for item in objects]
    finally:
        source.close()
        if drained.how == "drained by verify":
            catalog.act(name, "resume")
    return {"stream": name, "how": drained.how,
            "compared_at": format_rfc3339(at) if at is not None else
            "the source as it is now: valid at a quiet point, when nothing wrote since the "
            "drain", "objects": reports, "equal": all(r["equal"] for r in reports),
            "seconds": round(time.monotonic() - began, 3)}


def settle(catalog: Catalog, name: str, wait_seconds: float) -> DrainedAt:
    """Bring the stream to a drained PAUSED state (module docstring); say how."""
    record = catalog.get(name)
    status = catalog.status(name)
    drained = status.get("drained") or {}
    match record.state:
        case StreamState.PAUSED if drained.get("changed") == record.changed:
            return DrainedAt("on a drained stream", int(drained["through"]))
        case StreamState.PAUSED:
            catalog.act(name, "resume")
            catalog.act(name, "drain")
            how = "resumed and drained by verify (it was paused, not drained)"
        case StreamState.RUNNING:
            catalog.act(name, "drain")
            how = "drained by verify"
        case StreamState.DRAINING:
            how = "on a stream that was draining: verify waited for it"
        case _:
            raise FailedPrecondition(f"stream {name!r} is {record.state.value}: verify needs "
                                     "a RUNNING, DRAINING or PAUSED stream")
    return DrainedAt(how, _wait_drained(catalog, name, wait_seconds))


def _wait_drained(catalog: Catalog, name: str, wait_seconds: float) -> int:
    """Wait for the drain to finish. A stream that fails meanwhile is retried by the runner:
    once it runs again, it is asked to drain again; only FAILED_PERMANENTLY (or the time
    running out) ends the wait with an error."""
    deadline = time.monotonic() + wait_seconds
    while True:
        record = catalog.get(name)
        drained = catalog.status(name).get("drained") or {}
        if record.state == StreamState.PAUSED and drained.get("changed") == record.changed:
            return int(drained["through"])
        if record.state == StreamState.RUNNING:
            catalog.act(name, "drain")  # it failed while draining, and runs again
        elif record.state not in (StreamState.DRAINING, StreamState.PAUSED,
                                  StreamState.FAILED, StreamState.STARTING):
            raise FailedPrecondition(f"stream {name!r} became {record.state.value} while "
                                     "verify waited for its drain (see cdcflow streams errors)")
        if time.monotonic() > deadline:
            raise FailedPrecondition(
                f"stream {name!r} was not drained within {wait_seconds:.0f} s (it is "
                f"{record.state.value}): is `cdcflow run` running on this catalog? It drains "
                "streams")
        time.sleep(0.2)


def _objects(source: ChangeSource, definition: StreamDefinition,
             object_name: str | None) -> list[SourceObject]:
    objects = [o for o in source.discover() if definition.selects(o.name) and o.primary_key]
    if object_name is None:
        return objects
    chosen = [o for o in objects if o.name == object_name]
    if not chosen:
        raise NotFound(f"object {object_name!r} is not a keyed object of stream "
                       f"{definition.name!r} (it has {sorted(o.name for o in objects)})")
    return chosen


def verify_object(definition: StreamDefinition, source: ChangeSource, item: SourceObject,
                  at: Any) -> dict[str, Any]:
    """One object against each destination; a destination that cannot be read (a damaged
    event file, say) is reported with its error, and counts as a difference."""
    began = time.monotonic()
    canon = Canonicalizer(item)

    def read_source() -> Iterator[Canonical]:
        return source_rows(source, item, canon, at)

    mine = digest(read_source())
    report: dict[str, Any] = {"object": item.name, "rows": {"source": mine.rows}}
    equal = True
    for destination in definition.destinations:
        side = "cdc_table" if isinstance(destination, CdcTableDestination) else "events"
        try:
            found = _compare_destination(destination, definition, item, canon, read_source,
                                         mine)
        except CdcflowError as error:
            found = {"equal": False, "error": f"{type(error).__name__}: {error}"}
        report["rows"] |= found.pop("rows", {})
        report[side] = found
        equal = equal and found["equal"]
    report["equal"] = equal
    report["seconds"] = round(time.monotonic() - began, 3)
    return report


def _compare_destination(destination: Any, definition: StreamDefinition, item: SourceObject,
                         canon: Canonicalizer, read_source: Callable[[], Iterator[Canonical]],
                         mine: Digest) -> dict[str, Any]:
    if isinstance(destination, CdcTableDestination):
        table = CdcTable.open(Path(destination.warehouse) / item.name)
        table.apply()  # what is pending: the comparison is of the applied rows
        _, theirs, difference = compare(read_source, partial(table_rows, table, canon), mine)
        return difference.as_dict() | {"rows": {"cdc_table": theirs.rows}}
    events = EventRows(destination.root, definition.name, destination.format, item, canon,
                       groups_for(mine.rows))
    _, theirs, difference = compare(read_source, events, mine)
    return difference.as_dict() | {"rows": {"events_rebuilt": theirs.rows},
                                   "events_read": events.events,
                                   "duplicate_uuids": events.duplicate_uuids}
