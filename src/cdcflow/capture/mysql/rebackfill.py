"""Backfilling one table again while the binlog capture goes on (`cdcflow streams backfill`).

Each chunk is read, in key order, inside a consistent-snapshot transaction of its own whose
binlog position is known exactly (`snapshot.open_consistent`): the snapshot sees every
transaction the binlog holds before that position and none after it. The chunk is held
until the capture has passed that position between two transactions, and is then appended
to the change log as one transaction of whole rows (read method `mysql-backfill-fulldump`).
So the chunk lands in the log exactly where its snapshot sits in the binlog: the changes
before it are older than its rows, the ones after it newer, and no watermark and no key
deduplication are needed (where PostgreSQL needs them, see `capture.postgres.rebackfill`).

The request's progress rides in the source position of every append, so a worker killed
mid-way goes on after its last appended chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cdcflow.capture.mysql.catalog import read_tables
from cdcflow.capture.mysql.connection import Endpoint
from cdcflow.capture.mysql.snapshot import open_consistent, read_chunk
from cdcflow.capture.source import SourceObject, taken_request
from cdcflow.errors import InvalidArgument
from cdcflow.model.changes import SourceChange, SourceTransaction
from cdcflow.model.source import MYSQL, SourceMetadata


def file_order(log_file: str, position: int) -> tuple[int, int]:
    """A binlog position as numbers: the file's sequence suffix, then the offset."""
    return int(log_file.rsplit(".", 1)[-1]), int(position)


@dataclass(slots=True)
class HeldChunk:
    """A chunk read at binlog position `at`, waiting for the capture to pass it."""

    item: SourceObject
    rows: list[dict[str, Any]]
    after: Any
    more: bool
    at: dict[str, Any]


@dataclass(slots=True)
class Rebackfill:
    """The request being served (from the source position) and its chunk in flight."""

    endpoint: Endpoint
    mariadb: bool
    chunk_rows: int
    state: dict[str, Any] | None
    chunk: HeldChunk | None = None

    def take(self, request: dict[str, Any] | None, since: int) -> None:
        """Start serving `request` unless it waits or was served (`taken_request`)."""
        taken = taken_request(self.state, request, since)
        if taken is not None:
            self.state, self.chunk = taken, None

    @property
    def busy(self) -> bool:
        return self.state is not None and not self.state["done"]

    def read_next(self) -> None:
        """Read the next chunk in a snapshot of its own and hold it with its position."""
        assert self.state is not None
        name = str(self.state["object"])
        database = name.split(".", 1)[0]
        conn, at = open_consistent(self.endpoint, self.mariadb)
        try:
            tables = [t for t in read_tables(conn, (database,)) if t.object_name == name]
            if not tables:
                raise InvalidArgument(f"table {name!r} to backfill again does not exist")
            item = tables[0].source_object()
            if not item.primary_key:
                raise InvalidArgument(f"table {name!r} has no primary key: a backfill of it "
                                      "while the stream goes on reads it in key order")
            rows, after, more = read_chunk(conn, tables[0], item, self.state["after"],
                                           self.chunk_rows)
        finally:
            conn.rollback()
            conn.close()
        self.chunk = HeldChunk(item, rows, after, more, at)

    def ready(self, log_file: str | None, log_position: int) -> bool:
        """True once the capture, between two transactions, stands at or past the chunk's
        snapshot position: every transaction the snapshot saw is in the log before it."""
        return self.chunk is not None and log_file is not None and file_order(
            log_file, log_position) >= file_order(self.chunk.at["log_file"],
                                                  self.chunk.at["log_position"])

    def finish(self, source_time: datetime) -> SourceTransaction | None:
        """The held chunk's rows as one transaction (None: it had none), and the request's
        progress moved on."""
        assert self.chunk is not None and self.state is not None
        chunk, self.chunk = self.chunk, None
        self.state = self.state | {"after": chunk.after, "done": not chunk.more,
                                   "chunks": self.state["chunks"] + 1,
                                   "rows": self.state["rows"] + len(chunk.rows)}
        if not chunk.rows:
            return None
        keys, types = set(chunk.item.primary_key), chunk.item.column_types()
        at = {"log_file": chunk.at["log_file"], "log_position": chunk.at["log_position"]}
        rows = [chunk.item.encoded(row) for row in chunk.rows]  # Python values as read
        changes = tuple(SourceChange(
            chunk.item.name, "INSERT", {k: v for k, v in row.items() if k in keys},
            {k: v for k, v in row.items() if k not in keys}, {}, types, "NEW_ROW",
            at | {"row": index}) for index, row in enumerate(rows))
        return SourceTransaction(SourceMetadata(MYSQL.backfill_method, source_time,
                                                str(self.state["id"]), at), changes)
