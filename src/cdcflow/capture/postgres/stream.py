"""The capture loop: a replication slot's pgoutput stream into the change log.

Committed transactions are appended with the source position after the last of them,
`{"commit_lsn", "end_lsn"}`, in one log transaction: one at a time while the worker keeps up,
in batches while it is behind. Only then is that end LSN confirmed to the server
(`send_feedback`). A restart streams from the stored end LSN and skips every transaction
whose commit LSN is not past the stored one, so none is appended twice. (Several messages can
share an LSN, as BEGIN does with the first change: transactions are told apart by their
commit LSN, never by a change's LSN.)

WAL must not pile up while the published tables are idle: every `heartbeat_seconds` with
nothing in flight the loop emits a non-transactional logical message (`pg_logical_emit_message`)
and confirms its LSN when it comes back, since every transaction that committed before it
has been seen by then.
"""

from __future__ import annotations

import contextlib
import pickle
import select
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from cdcflow.capture.postgres import pgoutput
from cdcflow.capture.postgres.catalog import TypeCache, primary_key
from cdcflow.capture.postgres.changes import RelationShape, to_changes
from cdcflow.capture.postgres.connection import typed
from cdcflow.capture.postgres.rebackfill import HIGH, LOW, Rebackfill
from cdcflow.capture.postgres.types import text_converter, unified_type
from cdcflow.clock import SYSTEM_CLOCK
from cdcflow.errors import InvalidArgument, TypeMismatch
from cdcflow.model.changes import SourceChange, SourceTransaction
from cdcflow.model.records import ColumnTypeInfo
from cdcflow.model.source import POSTGRES, SourceMetadata, lsn_number
from cdcflow.model.timestamps import from_micros, to_micros
from cdcflow.store.changelog import ChangeLog

HEARTBEAT_PREFIX = "cdcflow-heartbeat"
KEEPALIVE_SECONDS = 5.0


@dataclass(slots=True)
class Settings:
    """What the loop needs besides its connections."""

    source_id: str
    slot: str
    publication: str
    heartbeat_seconds: float
    selected: Callable[[str], bool]
    primary_keys: dict[str, tuple[str, ...]]
    numeric: dict[str, tuple[int, int]]
    report: Callable[[str, str], None]
    """(object, message): a problem to show in `streams errors` (a TRUNCATE, say)."""
    requests: Callable[[], dict[str, Any] | None] = lambda: None
    """The latest request to backfill a table again ({"id", "object"}), if any."""
    progress: Callable[[dict[str, Any]], None] = lambda state: None
    """Hears how the request served goes."""
    chunk_rows: int = 5_000


BATCH_TRANSACTIONS, BATCH_CHANGES, BATCH_SECONDS = 500, 5_000, 0.1
"""A worker that is behind appends up to this many committed transactions (or changes, or
seconds' worth) in one log transaction; one that keeps up appends each as it comes."""
SPILL_AT = 10_000
"""A transaction with more changes than this keeps them in a temporary file, not in memory."""


@dataclass(slots=True)
class _Transaction:
    """The changes of the transaction being received; beyond SPILL_AT they go to a file."""

    begin: pgoutput.Begin
    changes: list[SourceChange] = field(default_factory=list)
    spill: IO[bytes] | None = None
    shapes: dict[int, tuple[ColumnTypeInfo, ...]] = field(default_factory=dict)

    def add(self, changes: list[SourceChange]) -> None:
        self.changes += changes
        if len(self.changes) >= SPILL_AT:
            if self.spill is None:
                self.spill = tempfile.TemporaryFile(prefix="cdcflow-transaction-")  # noqa: SIM115 closed at commit
            packed = [self._pack(c) for c in self.changes]
            pickle.dump(packed, self.spill, pickle.HIGHEST_PROTOCOL)
            self.changes = []

    def _pack(self, change: SourceChange) -> tuple[Any, ...]:
        """A change as plain values (fast to pickle); its column types by reference."""
        key = id(change.column_types)
        self.shapes.setdefault(key, change.column_types)
        return (change.table, change.mod_type, change.keys, change.new_values,
                change.old_values, key, change.value_capture_type, change.position)

    def empty(self) -> bool:
        return not self.changes and self.spill is None

    def read(self) -> Iterator[SourceChange]:
        """Every change in order (the spilled ones first); can be read again."""
        if self.spill is not None:
            self.spill.seek(0)
            while True:
                try:
                    packed = pickle.load(self.spill)
                except EOFError:
                    break
                for table, kind, keys, new, old, shape, capture, position in packed:
                    yield SourceChange(table, kind, keys, new, old, self.shapes[shape],
                                       capture, position)
        yield from self.changes

    def close(self) -> None:
        if self.spill is not None:
            self.spill.close()


class CaptureLoop:
    """One run of the loop; `run(stop)` returns when `stop` is set."""

    def __init__(self, settings: Settings, log: ChangeLog, replication: Any, sql: Any,
                 reader: Any = None) -> None:
        self.settings, self.log, self.replication, self.sql = settings, log, replication, sql
        self.cursor = replication.cursor()
        self.types = TypeCache()
        self.shapes: dict[int, RelationShape | None] = {}
        self.transaction: _Transaction | None = None
        stored = log.position(settings.source_id)
        self.after: dict[str, Any] | None = None if stored is None else stored.position
        self.last_commit = 0 if self.after is None else lsn_number(self.after["commit_lsn"])
        self.heartbeat_due = time.monotonic() + settings.heartbeat_seconds
        self.feedback_due = time.monotonic() + KEEPALIVE_SECONDS
        self.requests_due = 0.0
        self.batch: list[SourceTransaction] = []
        self.batch_changes, self.batch_due = 0, 0.0
        self.unsaved: dict[str, Any] | None = None  # the position after the batch
        self.again = Rebackfill(sql, reader, self.types, settings.primary_keys, settings.numeric,
                                settings.chunk_rows,
                                None if self.after is None else self.after.get("rebackfill"))
        if self.again.state is not None:  # it may not have been heard before a restart
            settings.progress(self.again.state)

    def run(self, stop: threading.Event) -> None:
        start = 0 if self.after is None else lsn_number(self.after["end_lsn"])
        try:
            self.cursor.start_replication(
                slot_name=self.settings.slot, decode=False, start_lsn=start,
                options={"proto_version": "1", "publication_names": self.settings.publication,
                         "messages": "true"})
        except Exception as error:
            raise typed(error, f"starting replication from slot {self.settings.slot!r}") \
                from None
        while not stop.is_set():
            message = self.cursor.read_message()
            if message is None:
                self._flush()
                self._idle()
                continue
            self._handle(pgoutput.decode(message.payload), message.data_start)
            if self.batch and (len(self.batch) >= BATCH_TRANSACTIONS or self.batch_changes >=
                               BATCH_CHANGES or time.monotonic() >= self.batch_due):
                self._flush()
            if time.monotonic() >= self.feedback_due:  # busy for long: still say we live
                self._keepalive()
        self._flush()

    def _keepalive(self) -> None:
        """A status update to the server (the last confirmed LSN again), so that a long
        transaction or a long append never looks like a dead client (wal_sender_timeout)."""
        self.cursor.send_feedback(force=True)
        self.feedback_due = time.monotonic() + KEEPALIVE_SECONDS

    def _between_transactions(self) -> None:
        """Serve a request to backfill a table again: read its next chunk between watermarks
        unless one is in flight (checked between transactions, busy or idle)."""
        if self.transaction is not None or self.again.chunk is not None:
            return
        if not self.again.busy and time.monotonic() < self.requests_due:
            return
        self.requests_due = time.monotonic() + 1.0
        self._flush()  # the request's state rides in the positions from here on
        self.again.take(self.settings.requests(), to_micros(self.log.current_timestamp()) + 1)
        if not self.again.busy:
            return
        try:
            self.again.read_next(self._emit)
        except (InvalidArgument, TypeMismatch) as error:  # the table went, lost its key...
            self._rebackfill_failed(str(error))

    def _rebackfill_failed(self, why: str) -> None:
        """End the request as failed, durably (a restart must not try it again), and say so."""
        assert self.again.state is not None
        self.again.state = self.again.state | {"done": True, "failed": why}
        end = 0 if self.after is None else lsn_number(self.after["end_lsn"])
        self.unsaved = self._position(self.last_commit, end)
        self._flush()
        self.settings.report(self.again.state["object"], why)
        self.settings.progress(self.again.state)

    def _idle(self) -> None:
        self._between_transactions()
        if self.transaction is None and time.monotonic() >= self.heartbeat_due:
            with self.sql.cursor() as cur:
                cur.execute("SELECT pg_logical_emit_message(false, %s, now()::text)",
                            (HEARTBEAT_PREFIX,))
            self.heartbeat_due = time.monotonic() + self.settings.heartbeat_seconds
        select.select([self.cursor], [], [], 0.2)

    def _handle(self, message: pgoutput.PgMessage, lsn: int) -> None:
        match message:  # the most frequent first
            case pgoutput.Update() | pgoutput.Insert() | pgoutput.Delete():
                shape = self.shapes.get(message.relation_id)
                if shape is not None and self.transaction is not None:
                    changes = to_changes(shape, message, lsn)
                    self.again.saw(changes, self.transaction.begin.xid)
                    self.transaction.add(changes)
            case pgoutput.Begin():
                self.transaction = _Transaction(message)
            case pgoutput.Relation():
                self.shapes[message.relation_id] = self._shape(message)
            case pgoutput.Truncate():
                self._truncated(message)
            case pgoutput.Message(prefix=prefix, transactional=False) \
                    if prefix == HEARTBEAT_PREFIX and self.transaction is None:
                self._heartbeat(message.lsn)
            case pgoutput.Message(prefix=prefix, transactional=False, content=content) \
                    if prefix in (LOW, HIGH) and self.again.watermark(prefix, content):
                self._chunk_done(message.lsn)
            case pgoutput.Commit():
                self._commit(message)

    def _shape(self, relation: pgoutput.Relation) -> RelationShape | None:
        name = f"{relation.namespace}.{relation.name}"
        if not self.settings.selected(name):
            return None
        self.types.load(self.sql, {c.type_oid for c in relation.columns})
        keys = self.settings.primary_keys.get(name) or primary_key(self.sql,
                                                                   relation.relation_id)
        types = [unified_type(self.types.pg_type(c.type_oid), c.type_modifier,
                              self.settings.numeric.get(f"{name}.{c.name}"))
                 for c in relation.columns]
        column_types = tuple(ColumnTypeInfo(c.name, t, c.name in keys, i)
                             for i, (c, t) in enumerate(zip(relation.columns, types,
                                                            strict=True), start=1))
        return RelationShape(name, tuple(c.name for c in relation.columns),
                             tuple(text_converter(t) for t in types), column_types, keys)

    def _emit(self, prefix: str, content: str) -> None:
        with self.sql.cursor() as cur:
            cur.execute("SELECT pg_logical_emit_message(false, %s, %s)", (prefix, content))

    def _position(self, commit_lsn: int, end_lsn: int) -> dict[str, Any]:
        """The source position: where a restart streams from, the last commit appended, and
        the progress of a table being backfilled again."""
        position: dict[str, Any] = {"commit_lsn": pgoutput.lsn_text(commit_lsn),
                                    "end_lsn": pgoutput.lsn_text(end_lsn)}
        if self.again.state is not None:
            position["rebackfill"] = dict(self.again.state)  # a copy: state moves on
        return position

    def _chunk_done(self, lsn: int) -> None:
        """At the high watermark: the chunk's rows the stream did not change meanwhile."""
        self._flush()
        transaction = self.again.finish(lsn, SYSTEM_CLOCK.now())
        position = self._position(self.last_commit, lsn)
        if transaction is not None:
            self.log.append(self.settings.source_id, transaction, self.after, position)
        else:
            self.log.advance(self.settings.source_id, self.after, position)
        self.after = position
        assert self.again.state is not None
        self.settings.progress(self.again.state)

    def _heartbeat(self, lsn: int) -> None:
        """Every transaction that committed before this message is in the log: resume from
        here after a restart, and let the server free the WAL before it."""
        self._flush()
        if self.after is not None and lsn <= lsn_number(self.after["end_lsn"]):
            return
        position = self._position(self.last_commit, lsn)
        self.log.advance(self.settings.source_id, self.after, position)
        self.after = position
        self.cursor.send_feedback(flush_lsn=lsn)

    @contextlib.contextmanager
    def _keeping_alive(self) -> Iterator[None]:
        """While a long append runs, a helper thread sends the status updates (nothing else
        uses the replication connection meanwhile)."""
        done = threading.Event()

        def beat() -> None:
            while not done.wait(KEEPALIVE_SECONDS):
                self.cursor.send_feedback(force=True)

        helper = threading.Thread(target=beat, name="cdcflow-keepalive", daemon=True)
        helper.start()
        try:
            yield
        finally:
            done.set()
            helper.join()

    def _truncated(self, message: pgoutput.Truncate) -> None:
        for relation_id in message.relation_ids:
            shape = self.shapes.get(relation_id)
            if shape is not None:
                self.settings.report(shape.object_name, (
                    f"TRUNCATE of {shape.object_name} was not applied: a CDC table keeps its "
                    "rows; backfill the table again to match the source"))

    def _commit(self, commit: pgoutput.Commit) -> None:
        """Put a committed transaction into the batch (a large one is appended on its own);
        a transaction with nothing selected only moves the position."""
        transaction, self.transaction = self.transaction, None
        if commit.commit_lsn <= self.last_commit:
            return  # appended before a restart
        position = self._position(commit.commit_lsn, commit.end_lsn)
        self.last_commit = commit.commit_lsn
        if transaction is None or transaction.empty():
            self.unsaved = position
        else:
            metadata = SourceMetadata(POSTGRES.cdc_method, from_micros(commit.commit_micros),
                                      str(transaction.begin.xid),
                                      {"commit_lsn": position["commit_lsn"]})
            if transaction.spill is None:
                if not self.batch:
                    self.batch_due = time.monotonic() + BATCH_SECONDS
                self.batch.append(SourceTransaction(metadata, tuple(transaction.changes)))
                self.batch_changes += len(transaction.changes)
                self.unsaved = position
            else:
                self._flush()
                self._append_large(metadata, transaction, position)
        self._between_transactions()

    def _append_large(self, metadata: SourceMetadata, transaction: _Transaction,
                      position: dict[str, Any]) -> None:
        try:
            with self._keeping_alive():
                self.log.append_large(self.settings.source_id, metadata, transaction.read,
                                      self.after, position)
        finally:
            transaction.close()
        self._saved(position)

    def _flush(self) -> None:
        """Append the batch of committed transactions (one log transaction for all), or
        store the position they moved to; then confirm it to the server."""
        if self.unsaved is None:
            return
        if self.batch:
            self.log.append_many(self.settings.source_id, self.batch, self.after, self.unsaved)
        else:
            self.log.advance(self.settings.source_id, self.after, self.unsaved)
        self.batch, self.batch_changes = [], 0
        self._saved(self.unsaved)

    def _saved(self, position: dict[str, Any]) -> None:
        self.after, self.unsaved = position, None
        self.cursor.send_feedback(flush_lsn=lsn_number(position["end_lsn"]))
