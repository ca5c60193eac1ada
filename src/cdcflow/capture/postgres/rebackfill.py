"""Backfilling one table again while the stream goes on, in chunks between watermarks (the
DBLog method; Debezium's incremental snapshots and Sequin's backfills work alike).

For each chunk the capture worker emits a low watermark into the slot's stream, reads the
next key-ordered chunk of the table, and emits a high watermark. Between the two watermarks
in the stream come exactly the transactions that committed while the chunk was read: every
key they change is dropped from the chunk, since the stream carries its newer value. At the
high watermark the rest of the chunk is appended to the change log as one transaction of
whole rows (read method `postgresql-backfill`), together with the request's progress in the
source position, so a worker killed mid-way goes on from its last appended chunk.

A commit is written to the WAL a moment before other sessions can see it (longer under
synchronous replication), so a transaction can precede the low watermark in the stream and
still be invisible to the chunk's snapshot. The chunk is therefore read in a REPEATABLE READ
transaction whose snapshot (`pg_current_snapshot()`) is kept: the keys of every streamed
transaction that snapshot cannot see are dropped as well, whether it came before the low
watermark (recent ones are remembered) or after.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg2.errors

from cdcflow.capture.postgres.catalog import TypeCache, read_tables, source_object
from cdcflow.capture.postgres.pgoutput import lsn_text
from cdcflow.capture.postgres.snapshot import read_chunk
from cdcflow.capture.source import SourceObject, taken_request
from cdcflow.errors import InvalidArgument
from cdcflow.model.changes import SourceChange, SourceTransaction
from cdcflow.model.source import POSTGRES, SourceMetadata

LOW = "cdcflow-low-watermark"
HIGH = "cdcflow-high-watermark"
RECENT_CHANGES = 100_000
"""How many changes of the table being read again are remembered with their transaction."""
_WRAP = 2**32


def _precedes(a: int, b: int) -> bool:
    """Transaction id `a` comes before `b`, 32-bit ids compared modulo 2^32 as PostgreSQL
    does."""
    return 0 < (b - a) % _WRAP < _WRAP // 2


@dataclass(frozen=True, slots=True)
class SnapshotView:
    """Which transactions a pg_snapshot (xmin:xmax:xip) sees, for pgoutput's 32-bit ids."""

    xmin: int
    xmax: int
    running: frozenset[int]

    @staticmethod
    def parse(text: str) -> SnapshotView:
        low, high, running = text.split(":")
        return SnapshotView(int(low) % _WRAP, int(high) % _WRAP,
                            frozenset(int(x) % _WRAP for x in running.split(",") if x))

    def sees(self, xid: int) -> bool:
        if _precedes(xid, self.xmin):
            return True
        return _precedes(xid, self.xmax) and xid not in self.running


@dataclass(slots=True)
class Chunk:
    """A chunk read between two watermarks, keyed by the record-encoded primary key."""

    rows: dict[tuple[Any, ...], dict[str, Any]]
    after: Any
    more: bool
    view: SnapshotView
    open: bool = False

    def drop_unseen(self, recent: Iterable[tuple[int, dict[str, Any]]],
                    keys: tuple[str, ...]) -> None:
        """Leave out the rows that streamed transactions the chunk's snapshot could not see
        changed: those transactions are in the log already, with newer values."""
        for xid, changed in recent:
            if not self.view.sees(xid):
                self.rows.pop(tuple(changed[k] for k in keys), None)


@dataclass(slots=True)
class Rebackfill:
    """The request being served (from the source position) and its chunk in flight."""

    sql: Any
    reader: Any
    """A connection of its own for the chunks (they are read as output text)."""
    types: TypeCache
    primary_keys: dict[str, tuple[str, ...]]
    numeric: dict[str, tuple[int, int]]
    chunk_rows: int
    state: dict[str, Any] | None
    item: SourceObject | None = None
    chunk: Chunk | None = None
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    recent: deque[tuple[int, dict[str, Any]]] = field(
        default_factory=lambda: deque(maxlen=RECENT_CHANGES))
    """(transaction id, keys) of the latest streamed changes of the table being read."""

    def take(self, request: dict[str, Any] | None, since: int) -> None:
        """Start serving `request` unless it waits or was served (`taken_request`)."""
        taken = taken_request(self.state, request, since)
        if taken is not None:
            self.state, self.item = taken, None
            self.recent.clear()

    @property
    def busy(self) -> bool:
        return self.state is not None and not self.state["done"]

    def _object(self) -> SourceObject:
        """The table as it is now (read for every chunk: columns may come and go)."""
        assert self.state is not None
        name = self.state["object"]
        tables = [t for t in read_tables(self.sql) if t.object_name == name]
        if not tables:
            raise InvalidArgument(f"table {name!r} to backfill again does not exist")
        self.types.load(self.sql, {c.type_oid for c in tables[0].columns})
        numeric = {k.rsplit(".", 1)[1]: v for k, v in self.numeric.items()
                   if k.rsplit(".", 1)[0] == name}
        item = source_object(tables[0], self.types, self.primary_keys.get(name), numeric)
        if not item.primary_key:
            raise InvalidArgument(f"table {name!r} has no primary key: a backfill of it "
                                  "while the stream goes on needs one (primary_keys)")
        return item

    def read_next(self, emit: Callable[[str, str], None]) -> None:
        """Low watermark, the next chunk in a snapshot of its own, high watermark. Rows that
        recent transactions invisible to that snapshot changed are left out at once."""
        assert self.state is not None
        self.item = item = self._object()
        emit(LOW, self.token)
        view, (rows, after, more) = self._read(item)
        emit(HIGH, self.token)
        keys = item.primary_key
        chunk = Chunk({tuple(r[k] for k in keys): r for r in rows}, after, more, view)
        chunk.drop_unseen(self.recent, keys)
        self.chunk = chunk

    def _read(self, item: SourceObject) -> tuple[SnapshotView, Any]:
        assert self.state is not None
        with self.reader.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                cur.execute("SELECT pg_current_snapshot()::text")
                (snapshot,) = cur.fetchone()
                read = read_chunk(self.reader, item, self.state["after"], None,
                                  self.chunk_rows)
            except psycopg2.errors.UndefinedTable:
                raise InvalidArgument(f"table {item.name!r} to backfill again was dropped "
                                      "while it was read") from None
            except psycopg2.errors.UndefinedColumn as error:
                raise InvalidArgument(f"table {item.name!r} changed shape while it was read "
                                      f"({str(error).strip()}); ask again") from None
            finally:
                cur.execute("ROLLBACK")
        return SnapshotView.parse(snapshot), read

    def watermark(self, prefix: str, content: bytes) -> bool:
        """Note a watermark of ours; True at the high one, when the chunk is ready."""
        if self.chunk is None or content.decode() != self.token:
            return False
        if prefix == LOW:
            self.chunk.open = True
            return False
        return prefix == HIGH

    def saw(self, changes: list[SourceChange], xid: int) -> None:
        """Changes committed while the chunk was read, or by a transaction its snapshot could
        not see, win over its rows."""
        if not self.busy:
            return
        name = self.state["object"] if self.state is not None else None
        chunk, item = self.chunk, self.item
        for change in changes:
            if change.table != name:
                continue
            self.recent.append((xid, change.keys))
            if chunk is not None and item is not None and (chunk.open or
                                                           not chunk.view.sees(xid)):
                chunk.rows.pop(tuple(change.keys[k] for k in item.primary_key), None)

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
