"""The capture loop: a row-based binlog, read through mysql-replication in a reader process
of its own (`reader`), into the change log.

A transaction is the group between a GTID event and its XID (or COMMIT) event; a DDL is a
standalone GTID group of one query. Committed groups are appended with the source position
after the last of them, `{"gtid", "log_file", "log_position"}`, in the same log transaction
as their records (`ChangeLog.append_many`); groups that touch no watched table only move the
position (`advance`). While the server has more to send, up to
BATCH_TRANSACTIONS groups or BATCH_SECONDS share one log transaction, so a capture that is
behind pays one commit for many; once the reader has nothing more to hand over, the batch is
appended at once.
A restart streams from the stored GTID state on MariaDB (the server then sends exactly the
groups after it), or from the stored file and position on MySQL, so no transaction is
appended twice or skipped.

Between two transactions (and at the server's heartbeats, when idle) the loop serves a
request to backfill one table again (see `rebackfill`).

Column names and types come from each row event's table map (the server's
`binlog_row_metadata=FULL`), never from the current schema: an event written before an ALTER
decodes with the columns it was written with.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cdcflow.capture.mysql.connection import Endpoint
from cdcflow.capture.mysql.position import GtidState, MySqlGtidSet, after_group
from cdcflow.capture.mysql.reader import BinlogReader, Event, ReadFrom, first_word
from cdcflow.capture.mysql.rebackfill import Rebackfill
from cdcflow.capture.mysql.rows import RowShape, described_shape
from cdcflow.capture.source import WorkerHooks
from cdcflow.clock import SYSTEM_CLOCK
from cdcflow.errors import InvalidArgument, TypeMismatch, Unavailable
from cdcflow.model.changes import SourceChange, SourceTransaction
from cdcflow.model.source import MYSQL, SourceMetadata
from cdcflow.model.timestamps import to_micros
from cdcflow.store.changelog import ChangeLog

BATCH_TRANSACTIONS, BATCH_CHANGES, BATCH_SECONDS = 500, 5_000, 0.1
TAKE_SECONDS = 0.05
"""The longest wait for the reader's next events, and so for a stop to be seen."""
_WHERE = {"gtid": 4, "xid": 2, "query": 4, "heartbeat": 1}
"""Where each kind of event carries the binlog position after it (log file, position)."""
CHUNKS_AT_ONCE = 8
"""Chunks of a table backfilled again that are read and appended in a row while the capture
is caught up, before it reads the binlog again."""


@dataclass(slots=True)
class Settings:
    """What the loop needs besides the log."""

    source_id: str
    endpoint: Endpoint
    server_id: int
    databases: tuple[str, ...]
    selected: Callable[[str], bool]
    mariadb: bool
    heartbeat_seconds: float = 1.0
    chunk_rows: int = 5_000
    hooks: WorkerHooks = field(default_factory=WorkerHooks)


@dataclass(slots=True)
class _Group:
    """The transaction being received."""

    gtid: str
    standalone: bool
    timestamp: int
    changes: list[SourceChange] = field(default_factory=list)


class BinlogCapture:
    """One run of the loop; `run(stop)` returns when `stop` is set (within a heartbeat)."""

    def __init__(self, settings: Settings, log: ChangeLog) -> None:
        self.settings, self.log = settings, log
        stored = log.position(settings.source_id)
        if stored is None:
            raise AssertionError("a MySQL capture starts from the position its snapshot set")
        self.after: dict[str, Any] = stored.position
        text = str(self.after.get("gtid") or "")
        self.gtid: GtidState | MySqlGtidSet = GtidState.parse(text) if settings.mariadb \
            else MySqlGtidSet.parse(text)
        self.group: _Group | None = None
        self.shapes: dict[tuple[int, tuple[str, ...]], RowShape] = {}
        self.reader: Any = None
        self.events: deque[Event] = deque()
        self.where = (str(self.after.get("log_file") or ""),
                      int(self.after.get("log_position") or 0))
        """The binlog position after the last event handled."""
        self.again = Rebackfill(settings.endpoint, settings.mariadb, settings.chunk_rows,
                                self.after.get("rebackfill"))
        self.requests_due = 0.0
        self.batch: list[SourceTransaction] = []
        self.batch_changes, self.batch_due = 0, 0.0
        self.unsaved: dict[str, Any] | None = None  # the position after the batch
        if self.again.state is not None:  # it may not have been heard before a restart
            settings.hooks.progress(self.again.state)

    def _read_from(self) -> ReadFrom:
        settings = self.settings
        return ReadFrom(settings.endpoint, settings.server_id, settings.databases,
                        settings.selected, settings.mariadb, self.gtid.text(),
                        str(self.after.get("log_file") or ""),
                        int(self.after.get("log_position") or 0), settings.heartbeat_seconds)

    def run(self, stop: threading.Event) -> None:
        """Read until `stop` is set (seen within TAKE_SECONDS)."""
        try:
            self.reader = BinlogReader(self._read_from())
            while not stop.is_set():
                if self.unsaved is not None and self.group is None and self._batch_due():
                    self._flush()  # checked between transactions only
                if not self.events:
                    try:
                        self.events.extend(self.reader.take(TAKE_SECONDS))
                    except Unavailable:
                        if stop.is_set():  # the reader went with a stop (a SIGTERM to all)
                            break
                        raise
                    continue
                self._handle(self.events.popleft())
            self._flush()
        finally:
            if self.reader is not None:
                self.reader.close()

    def _handle(self, event: Event) -> None:
        tag = event[0]
        if tag in _WHERE:
            self.where = (str(event[_WHERE[tag]]), int(event[_WHERE[tag] + 1]))
        if self.group is None:
            self._between_transactions()
        if tag == "gtid":
            self.group = _Group(str(event[1]), bool(event[2]), int(event[3]))
        elif tag == "table":
            _, key, table, columns, primary_key = event
            self.shapes[key] = described_shape(table, columns, primary_key)
        elif tag == "rows":
            if self.group is not None:
                self._rows(event)
        elif tag == "xid":
            self._commit(int(event[1]))
        elif tag == "query":
            self._query(str(event[1]), str(event[2]), int(event[3]))

    def _query(self, text: str, schema: str, timestamp: int) -> None:
        word = first_word(text)
        if word == "BEGIN" or self.group is None:
            return
        if word == "ROLLBACK":
            self.group = None
            return
        if word == "TRUNCATE":
            self._truncated(text, schema)
        if word == "COMMIT" or self.group.standalone:
            self._commit(timestamp)

    def _truncated(self, text: str, default: str) -> None:
        """A TRUNCATE is a statement in the binlog, without rows: say it is not applied."""
        words = text.replace("`", "").split()[1:]
        if words and words[0].upper() == "TABLE":
            words = words[1:]
        if not words:
            return
        name = words[0].rstrip(";") if "." in words[0] else f"{default}.{words[0].rstrip(';')}"
        if name.split(".", 1)[0] in self.settings.databases and self.settings.selected(name):
            self.settings.hooks.report(name, (
                f"TRUNCATE of {name} was not applied: a CDC table keeps its rows; backfill "
                "the table again to match the source"))

    def _rows(self, event: Event) -> None:
        _, key, kind, rows, log_file, log_position = event
        shape = self.shapes[key]
        position = {"log_file": log_file, "log_position": log_position}
        assert self.group is not None
        for index, row in enumerate(rows):
            self.group.changes += shape.changes(kind, row, position | {"row": index})

    def _commit(self, timestamp: int) -> None:
        group, self.group = self.group, None
        if group is None:
            return
        self.gtid = after_group(self.gtid, group.gtid)
        position = self._position({
            "gtid": self.gtid.text(), "log_file": self.where[0], "log_position": self.where[1]})
        if group.changes:
            metadata = SourceMetadata(MYSQL.cdc_method,
                                      datetime.fromtimestamp(timestamp or group.timestamp, UTC),
                                      group.gtid, {"log_file": position["log_file"],
                                                   "log_position": position["log_position"]})
            if not self.batch:
                self.batch_due = time.monotonic() + BATCH_SECONDS
            self.batch.append(SourceTransaction(metadata, tuple(group.changes)))
            self.batch_changes += len(group.changes)
        self.unsaved = position
        self._between_transactions()

    def _batch_due(self) -> bool:
        """Append now unless the server has more to send at once and the batch is small."""
        return not self._more_waiting() or len(self.batch) >= BATCH_TRANSACTIONS or \
            self.batch_changes >= BATCH_CHANGES or time.monotonic() >= self.batch_due

    def _more_waiting(self) -> bool:
        """The reader has more to hand over at once."""
        return bool(self.events) or self.reader.waiting()

    def _flush(self) -> None:
        """Append the batch of committed groups (one log transaction for all), or store the
        position they moved to."""
        if self.unsaved is None:
            return
        if self.batch:
            self.log.append_many(self.settings.source_id, self.batch, self.after, self.unsaved)
        else:
            self.log.advance(self.settings.source_id, self.after, self.unsaved)
        self.after, self.unsaved = self.unsaved, None
        self.batch, self.batch_changes = [], 0

    # ---- backfilling a table again --------------------------------------------------------

    def _position(self, where: dict[str, Any]) -> dict[str, Any]:
        """A source position: where a restart streams from, and the progress of a table
        being backfilled again."""
        if self.again.state is not None:
            return where | {"rebackfill": dict(self.again.state)}  # a copy: state moves on
        return where

    def _between_transactions(self) -> None:
        """Append the held chunk once the capture has passed its snapshot, and read the next
        one; look for a new request every second."""
        for _ in range(CHUNKS_AT_ONCE):
            if self.again.chunk is not None:
                if not self.again.ready(*self.where):
                    return
                self._append_chunk()
            elif not self._next_chunk():
                return

    def _next_chunk(self) -> bool:
        """Read the next chunk of the request served (taking a new request if one waits)."""
        if not self.again.busy:
            if time.monotonic() < self.requests_due:
                return False
            self.requests_due = time.monotonic() + 1.0
            self._flush()  # the request's state rides in the positions from here on
            self.again.take(self.settings.hooks.requests(),
                            to_micros(self.log.current_timestamp()) + 1)
            if not self.again.busy:
                return False
        try:
            self.again.read_next()
        except (InvalidArgument, TypeMismatch) as error:  # the table went, lost its key...
            self._rebackfill_failed(str(error))
            return False
        return True

    def _append_chunk(self) -> None:
        self._flush()  # the chunk comes after every group before its position
        transaction = self.again.finish(SYSTEM_CLOCK.now())
        position = self._position({k: v for k, v in self.after.items() if k != "rebackfill"})
        if transaction is not None:
            self.log.append(self.settings.source_id, transaction, self.after, position)
        else:
            self.log.advance(self.settings.source_id, self.after, position)
        self.after = position
        assert self.again.state is not None
        self.settings.hooks.progress(self.again.state)

    def _rebackfill_failed(self, why: str) -> None:
        """End the request as failed, durably (a restart must not try it again), and say so."""
        assert self.again.state is not None
        self._flush()
        self.again.state = self.again.state | {"done": True, "failed": why}
        position = self._position({k: v for k, v in self.after.items() if k != "rebackfill"})
        self.log.advance(self.settings.source_id, self.after, position)
        self.after = position
        self.settings.hooks.report(self.again.state["object"], why)
        self.settings.hooks.progress(self.again.state)
