"""The `ChangeSource` protocol: what every source of changes gives the runner.

A source lists its objects (`discover`), fixes a consistent snapshot (`snapshot`), reads its
objects as of that snapshot (`backfill`), and says where its changes are: the change log and
change stream the pipeline reads, and from which log time on (`Snapshot.cdc_start`), so that
the snapshot plus the changes after it equal the source with no gap and no duplicate in
effect. A backfill cut short resumes with the same snapshot where the source can keep one.
A source whose changes must be copied into the log (an external database) has a capture
worker: `capture` runs in its own process and appends each committed source transaction with
`ChangeLog.append`.

Resume invariant of `capture`: all its state derives from the log. It resumes after
`log.position(source_id)`, the position stored in the same log transaction as the last
transaction appended, so a worker killed at any point and started again appends every
committed source transaction exactly once. The source is acknowledged (a replication slot's
LSN, a binlog position) only after the append that covers it has committed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from cdcflow.model.records import ColumnTypeInfo
from cdcflow.model.source import SourceKind
from cdcflow.model.types import ColumnType, encode_value
from cdcflow.store.changelog import ChangeLog


@dataclass(frozen=True, slots=True)
class SourceColumn:
    """A field of an object (EV-10): name, unified type, nullability, key position."""

    name: str
    type: ColumnType
    nullable: bool
    key_position: int | None
    ordinal_position: int


@dataclass(frozen=True, slots=True)
class SourceObject:
    """An object of a source (a table), with its fields in ordinal order."""

    name: str
    columns: tuple[SourceColumn, ...]

    @property
    def primary_key(self) -> tuple[str, ...]:
        keyed = sorted((c for c in self.columns if c.key_position is not None),
                       key=lambda c: c.key_position or 0)
        return tuple(c.name for c in keyed)

    def column_types(self) -> tuple[ColumnTypeInfo, ...]:
        """CS-7 column types of the whole row."""
        keys = set(self.primary_key)
        return tuple(ColumnTypeInfo(c.name, c.type, c.name in keys, c.ordinal_position)
                     for c in self.columns)

    def encoded(self, row: dict[str, Any]) -> dict[str, Any]:
        """A row of Python values in the record encoding a `SourceChange` carries."""
        return {c.name: encode_value(row.get(c.name), c.type) for c in self.columns}

    def describe(self) -> dict[str, Any]:
        """Discovery's shape (EV-10)."""
        return {"object": self.name, "primary_key": list(self.primary_key), "fields": [{
            "name": c.name, "type": c.type.ddl(), "primary_key_position": c.key_position,
            "nullable": c.nullable, "ordinal_position": c.ordinal_position,
        } for c in self.columns]}


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A finished backfill: the snapshot's time, the source position it corresponds to, and
    the first log time the pipeline reads changes from."""

    read_timestamp: datetime
    position: dict[str, Any]
    cdc_start: datetime


@dataclass(frozen=True, slots=True)
class WorkerHooks:
    """How a capture worker talks to the stream it serves: `report(object, message)` puts a
    problem in its errors, `requests()` is the latest request to backfill a table again
    ({"id", "object"}, or None) and `progress(state)` hears how that request goes;
    `position_lost(message, objects)` hears that the source's stored position is gone and
    that the capture goes on from now once `objects` are queued to be backfilled again."""

    report: Callable[[str, str], None] = lambda object_name, message: None
    requests: Callable[[], dict[str, Any] | None] = lambda: None
    progress: Callable[[dict[str, Any]], None] = lambda state: None
    position_lost: Callable[[str, list[str]], None] = lambda message, objects: None


RowSink = Callable[[SourceObject, list[dict[str, Any]], Any], None]
"""Takes a chunk of an object's snapshot rows (Python values, every column) and the resume
token after it (JSON; None when the object's read cannot resume midway)."""


class ChangeSource(Protocol):
    """One source of changes; see the module docstring for the contract."""

    kind: SourceKind
    source_id: str
    has_worker: bool

    def discover(self) -> list[SourceObject]:
        """Every object of the source with its fields (EV-10)."""
        ...

    def log_location(self) -> tuple[str, str]:
        """(change-log path, change stream) that the pipeline reads."""
        ...

    def snapshot(self, objects: list[SourceObject], resume: dict[str, Any] | None) -> Snapshot:
        """Fix the snapshot to backfill `objects` from (and set up the capture of their
        changes from that point); `resume` is the position of an earlier attempt's snapshot,
        to be continued."""
        ...

    def release(self, snapshot: Snapshot) -> None:
        """The backfill of `snapshot` is done: let go of what kept it readable."""
        ...

    def backfill(self, snapshot: Snapshot, objects: list[SourceObject], sink: RowSink,
                 resume: dict[str, Any] | None = None) -> None:
        """Read `objects` as of `snapshot` into `sink`, in chunks in key order. `resume` maps
        an object to the token after its last chunk written (go on from there) or "done"
        (skip it)."""
        ...

    def capture(self, log: ChangeLog, stop: threading.Event) -> None:
        """Append committed source transactions to `log` until `stop` is set (worker only)."""
        ...

    def mark(self) -> Any:
        """Worker only: a marker in the source's change stream now (its position)."""
        ...

    def reached(self, log: ChangeLog, mark: Any) -> bool:
        """Worker only: whether the capture has appended everything before `mark`."""
        ...

    def status(self) -> dict[str, Any]:
        """What the source side reports (e.g. a slot's retained WAL, and `warn_above`, the
        amount past which a paused stream is warned about)."""
        ...

    def remove(self) -> None:
        """Drop what the source keeps on the server for this stream (a slot, a publication)."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


def taken_request(state: dict[str, Any] | None, request: dict[str, Any] | None,
                  since: int) -> dict[str, Any] | None:
    """The new state of a request to backfill a table again ({"id", "object"}), or None
    when it is not taken: none asked, one is still being served (one at a time: a newer one
    waits until it is done), or it is the one served already. `since` (log micros) is below
    every commit the log takes from now on: after the last chunk, a row of the table whose
    latest change is older is gone from the source (`CdcTable.delete_older_than`)."""
    if request is None or (state is not None and (not state["done"] or
                                                  state["id"] == request["id"])):
        return None
    return {"id": request["id"], "object": request["object"], "after": None, "chunks": 0,
            "rows": 0, "done": False, "since": since}
