"""The embedded database as a `ChangeSource`: its change streams are already in its log.

Nothing is copied: every commit writes its change records in its own transaction (CS-1), so
the pipeline reads the database file itself and there is no capture worker. A backfill reads
every object at one safe timestamp T, and changes are read from T + 1µs on.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

from cdcflow.capture.source import RowSink, Snapshot, SourceColumn, SourceObject
from cdcflow.errors import FailedPrecondition
from cdcflow.model.schema import TableSchema
from cdcflow.model.source import EMBEDDED
from cdcflow.model.timestamps import from_micros, to_micros
from cdcflow.store.changelog import ChangeLog
from cdcflow.store.database import Database

_CHUNK_ROWS = 10_000


def source_object(schema: TableSchema, watched: tuple[str, ...] | None = None) -> SourceObject:
    """An object of a table: its keys and (`watched`, default all) non-key columns."""
    keep = set(schema.primary_key) | set(watched if watched is not None else
                                         (c.name for c in schema.columns))
    keys = list(schema.primary_key)
    return SourceObject(schema.name, tuple(
        SourceColumn(c.name, c.type, not c.not_null,
                     keys.index(c.name) + 1 if c.name in keys else None, schema.ordinal(c.name))
        for c in schema.columns if c.name in keep))


class EmbeddedSource:
    """The tables of an embedded database file that a change stream watches."""

    kind = EMBEDDED
    has_worker = False

    def __init__(self, database: str, change_stream: str) -> None:
        self.database = Database.open(database, create=False)
        self.change_stream = change_stream
        self.source_id = f"embedded:{change_stream}"

    def discover(self) -> list[SourceObject]:
        """The tables the change stream watches, with the columns it captures."""
        stream = self.database.change_stream(self.change_stream)
        objects = []
        for table in self.database.tables():
            if stream.watches(table):
                schema = self.database.table_schema(table)
                objects.append(source_object(schema, stream.watched_columns(schema)))
        return objects

    def log_location(self) -> tuple[str, str]:
        return self.database.path, self.change_stream

    def snapshot(self, objects: list[SourceObject], resume: dict[str, Any] | None) -> Snapshot:
        """The safe time now, or an earlier attempt's snapshot time; pinned in the database
        (its row versions are kept) until `release`."""
        when = (self.database.current_timestamp() if resume is None
                else from_micros(int(resume["timestamp"])))
        self.database.pin_snapshot(self.source_id, when)
        return Snapshot(when, {"timestamp": to_micros(when)}, when + timedelta(microseconds=1))

    def release(self, snapshot: Snapshot) -> None:
        self.database.release_snapshot(self.source_id)

    def backfill(self, snapshot: Snapshot, objects: list[SourceObject], sink: RowSink,
                 resume: dict[str, Any] | None = None) -> None:
        """Rows in the order of their encoded keys; a resume token is the last key's text."""
        for item in objects:
            after = (resume or {}).get(item.name)
            if after == "done":
                continue
            schema = self.database.table_schema(item.name)
            keyed = [(schema.encode_key(schema.key_of(r)), r) for r in
                     self.database.scan(item.name, read_timestamp=snapshot.read_timestamp)]
            keyed = [pair for pair in keyed if after is None or pair[0] > after]
            names = [c.name for c in item.columns]
            for start in range(0, len(keyed), _CHUNK_ROWS):
                chunk = keyed[start:start + _CHUNK_ROWS]
                sink(item, [{n: r[n] for n in names} for _, r in chunk], chunk[-1][0])

    def status(self) -> dict[str, Any]:
        return {}

    def remove(self) -> None:
        """Nothing to drop: the change stream belongs to the database."""

    def mark(self) -> Any:
        """The safe time: every commit before it is in the log already."""
        return to_micros(self.database.current_timestamp())

    def reached(self, log: ChangeLog, mark: Any) -> bool:
        return True

    def capture(self, log: ChangeLog, stop: threading.Event) -> None:
        raise FailedPrecondition("the embedded source has no capture worker: its commits "
                                 "write their change records themselves (CS-1)")

    def close(self) -> None:
        self.database.close()
