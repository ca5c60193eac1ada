"""Backfilling one table again while the stream goes on, in chunks between watermarks (the
DBLog method; Debezium's incremental snapshots and Sequin's backfills work alike).

For each chunk the capture worker emits a low watermark into the slot's stream, reads the
next key-ordered chunk of the table, and emits a high watermark. Between the two watermarks
in the stream come exactly the transactions that committed while the chunk was read: every
key they change is dropped from the chunk, since the stream carries its newer value. At the
high watermark the rest of the chunk is appended to the change log as one transaction of
whole rows (read method `postgresql-backfill`), together with the request's progress in the
source position, so a worker killed mid-way goes on from its last appended chunk.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cdcflow.capture.postgres.catalog import TypeCache, read_tables, source_object
from cdcflow.capture.postgres.pgoutput import lsn_text
from cdcflow.capture.postgres.snapshot import read_chunk
from cdcflow.capture.source import SourceObject
from cdcflow.errors import InvalidArgument
from cdcflow.model.changes import SourceChange, SourceTransaction
from cdcflow.model.source import POSTGRES, SourceMetadata

LOW = "cdcflow-low-watermark"
HIGH = "cdcflow-high-watermark"


@dataclass(slots=True)
class Chunk:
    """A chunk read between two watermarks, keyed by the record-encoded primary key."""

    rows: dict[tuple[Any, ...], dict[str, Any]]
    after: Any
    more: bool
    open: bool = False


@dataclass(slots=True)
class Rebackfill:
    """The request being served (from the source position) and its chunk in flight."""

    sql: Any
    reader: Any
    """A connection of its own for the chunks (they are read as output text)."""
    types: TypeCache
    primary_keys: dict[str, tuple[str, ...]]
    chunk_rows: int
    state: dict[str, Any] | None
    item: SourceObject | None = None
    chunk: Chunk | None = None
    token: str = field(default_factory=lambda: uuid.uuid4().hex)

    def take(self, request: dict[str, Any] | None, since: int) -> None:
        """Start serving `request` ({"id", "object"}) unless it is the one served already.
        `since` (log micros) is below every commit the log will take from now on: after the
        last chunk, a row of the table whose latest change is older is gone from the source
        (see `cdcflow.table.CdcTable.delete_older_than`)."""
        if request is None or (self.state is not None and self.state["id"] == request["id"]):
            return
        self.state = {"id": request["id"], "object": request["object"], "after": None,
                      "chunks": 0, "rows": 0, "done": False, "since": since}
        self.item = None

    @property
    def busy(self) -> bool:
        return self.state is not None and not self.state["done"]

    def _object(self) -> SourceObject:
        if self.item is None:
            assert self.state is not None
            name = self.state["object"]
            tables = [t for t in read_tables(self.sql) if t.object_name == name]
            if not tables:
                raise InvalidArgument(f"table {name!r} to backfill again does not exist")
            self.types.load(self.sql, {c.type_oid for c in tables[0].columns})
            self.item = source_object(tables[0], self.types, self.primary_keys.get(name))
            if not self.item.primary_key:
                raise InvalidArgument(f"table {name!r} has no primary key: a backfill of it "
                                      "while the stream goes on needs one (primary_keys)")
        return self.item

    def read_next(self, emit: Callable[[str, str], None]) -> None:
        """Low watermark, the next chunk, high watermark."""
        assert self.state is not None
        item = self._object()
        emit(LOW, self.token)
        rows, after, more = read_chunk(self.reader, item, self.state["after"], None,
                                       self.chunk_rows)
        emit(HIGH, self.token)
        keys = item.primary_key
        self.chunk = Chunk({tuple(r[k] for k in keys): r for r in rows}, after, more)

    def watermark(self, prefix: str, content: bytes) -> bool:
        """Note a watermark of ours; True at the high one, when the chunk is ready."""
        if self.chunk is None or content.decode() != self.token:
            return False
        if prefix == LOW:
            self.chunk.open = True
            return False
        return prefix == HIGH

    def saw(self, changes: list[SourceChange]) -> None:
        """Changes committed while the chunk was read win over its rows."""
        if self.chunk is None or not self.chunk.open or self.item is None:
            return
        for change in changes:
            if change.table == self.item.name:
                self.chunk.rows.pop(tuple(change.keys[k] for k in self.item.primary_key),
                                    None)

    def finish(self, lsn: int, source_time: Any) -> SourceTransaction | None:
        """The chunk's remaining rows as one transaction (None: nothing left), and the
        request's progress moved on."""
        assert self.chunk is not None and self.state is not None and self.item is not None
        chunk, item, self.chunk = self.chunk, self.item, None
        self.state = self.state | {"after": chunk.after, "done": not chunk.more,
                                   "chunks": self.state["chunks"] + 1,
                                   "rows": self.state["rows"] + len(chunk.rows)}
        if not chunk.rows:
            return None
        keys = set(item.primary_key)
        changes = tuple(SourceChange(
            item.name, "INSERT", {k: v for k, v in row.items() if k in keys},
            {k: v for k, v in row.items() if k not in keys}, {}, item.column_types(),
            "NEW_ROW", {"lsn": lsn_text(lsn)}) for row in chunk.rows.values())
        metadata = SourceMetadata(POSTGRES.backfill_method, source_time,
                                  str(self.state["id"]), {})
        return SourceTransaction(metadata, changes)
