"""The writer of the change log: committed source transactions and source positions.

`append` is the one call an external source's capture worker makes: a transaction's records
and the source's position after it go into ONE log transaction, so a restart resumes exactly
after the last appended transaction and never appends one twice.
"""

from __future__ import annotations

import contextlib
import json
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cdcflow.errors import FailedPrecondition, InvalidArgument
from cdcflow.model.changes import SourceTransaction, validate_change, validate_metadata
from cdcflow.model.records import ColumnTypeInfo
from cdcflow.model.source import SourceKind, SourceMetadata
from cdcflow.model.timestamps import from_micros, to_micros
from cdcflow.store import log
from cdcflow.store.catalog import Catalog, next_commit_micros
from cdcflow.store.commit import append_entries, append_rows, next_transaction_ids
from cdcflow.store.session import Session
from cdcflow.store.source_records import Changes, encoded_source_records, source_records
from cdcflow.store.sqlite import read_transaction, write_transaction


@dataclass(frozen=True, slots=True)
class SourcePosition:
    """Where an external source stands: the position after its last appended transaction,
    that transaction's source time, and when the log recorded it."""

    position: dict[str, Any]
    source_timestamp: datetime | None
    appended_at: datetime



class LogWriter(ABC):
    """Mixin of `ChangeLog`: the writer API."""

    @abstractmethod
    def _session(self) -> Session:
        """This thread's session."""

    @abstractmethod
    def _now_micros(self) -> int:
        """The clock's current time in microseconds."""

    def append(self, source: str, transaction: SourceTransaction,
               after: dict[str, Any] | None, position: dict[str, Any]) -> datetime:
        """Append one committed source transaction and the source's position after it, in ONE
        log transaction; return its commit timestamp in the log.

        `after` is the position the caller resumed from or last appended: if the log holds
        another one for `source` (a second worker appended meanwhile), nothing is written and
        FailedPrecondition is raised. Resume invariant: `position(source)` is always the
        position after the last appended transaction, so a source that resumes from it never
        appends a transaction twice and never skips one. A transaction that breaks a rule is
        InvalidArgument naming the change and the rule, and nothing is written.
        """
        return self.append_large(source, transaction.metadata, lambda: transaction.changes,
                                 after, position)

    def append_many(self, source: str, transactions: Sequence[SourceTransaction],
                    after: dict[str, Any] | None, position: dict[str, Any]) -> list[datetime]:
        """Append several committed source transactions, in source order and each at its own
        log commit timestamp, and the source's position after the last, in ONE log
        transaction: a capture worker that is behind pays one commit for many. The same
        checks and guarantees as `append`; if any transaction breaks a rule, none is written."""
        if not transactions:
            raise InvalidArgument("append_many needs at least one source transaction")
        session = self._session()
        with _appending(session):
            catalog = session.refresh()
            self._check_after(source, after)
            written = self._write_many(session, catalog, transactions)
            log.write_position(session.conn, source, position,
                               to_micros(transactions[-1].metadata.source_timestamp),
                               written[-1])
        return [from_micros(micros) for micros in written]

    def append_large(self, source: str, metadata: SourceMetadata, changes: Changes,
                     after: dict[str, Any] | None, position: dict[str, Any]) -> datetime:
        """`append` for a transaction too large to hold in memory: `changes()` yields its
        changes in source order (from a file, say) and is called a few times; memory stays
        bounded by a record per partition. The same checks and guarantees as `append`."""
        session = self._session()
        with _appending(session):
            catalog = session.refresh()
            self._check_after(source, after)
            micros = self._write(session, catalog, metadata, changes)
            log.write_position(session.conn, source, position,
                               to_micros(metadata.source_timestamp), micros)
        return from_micros(micros)

    def _write(self, session: Session, catalog: Catalog, metadata: SourceMetadata,
               changes: Changes) -> int:
        """Check one transaction and write its records at the next commit timestamp, inside
        the caller's write transaction; return that timestamp."""
        kind = validate_metadata(metadata)
        tables = _scan(kind, metadata, changes, catalog, session)
        micros = next_commit_micros(session.conn, self._now_micros())
        streams = [s for s in catalog.streams.values()
                   if any(s.watches(table) for table in tables)]
        entries = source_records(metadata, changes, streams, session.ranges_of,
                                 from_micros(micros), str(next_transaction_ids(session, 1)))
        append_entries(session, catalog, entries, micros)
        return micros

    def _write_many(self, session: Session, catalog: Catalog,
                    transactions: Sequence[SourceTransaction]) -> list[int]:
        """`_write` for several transactions: checked first, then consecutive commit
        timestamps and transaction ids, and their records in one insert."""
        touched = [_scan(validate_metadata(t.metadata), t.metadata, _changes_of(t), catalog,
                         session) for t in transactions]
        first = next_commit_micros(session.conn, self._now_micros(), len(transactions))
        first_id = next_transaction_ids(session, len(transactions))
        written = [first + offset for offset in range(len(transactions))]

        def rows() -> Iterator[log.DataRow]:
            for offset, (transaction, tables) in enumerate(zip(transactions, touched,
                                                               strict=True)):
                streams = [s for s in catalog.streams.values()
                           if any(s.watches(table) for table in tables)]
                yield from encoded_source_records(
                    transaction.metadata, _changes_of(transaction), streams, session.ranges_of,
                    first + offset, str(first_id + offset))

        append_rows(session, catalog, rows(), written[-1])
        return written

    def advance(self, source: str, after: dict[str, Any] | None,
                position: dict[str, Any]) -> None:
        """Record a new position with nothing to append (e.g. the source moved past changes
        to unwatched tables); the same `after` check as `append`."""
        session = self._session()
        with write_transaction(session.conn):
            self._check_after(source, after)
            log.write_position(session.conn, source, position, None, self._now_micros())

    def _check_after(self, source: str, after: dict[str, Any] | None) -> None:
        stored = log.read_position(self._session().conn, source)
        current = None if stored is None else stored[0]
        if current != after:
            raise FailedPrecondition(
                f"source {source!r} is at position {current!r} in the log, not {after!r}: "
                "another capture worker appended meanwhile; resume from the log's position"
            )

    def position(self, source: str) -> SourcePosition | None:
        """The position after the last transaction appended for `source` (None: none yet)."""
        session = self._session()
        with read_transaction(session.conn):
            stored = log.read_position(session.conn, source)
        if stored is None:
            return None
        position, source_micros, appended = stored
        return SourcePosition(position, None if source_micros is None else
                              from_micros(source_micros), from_micros(appended))

    def forget_position(self, source: str) -> None:
        session = self._session()
        with write_transaction(session.conn):
            log.delete_position(session.conn, source)


@contextlib.contextmanager
def _appending(session: Session) -> Iterator[None]:
    """A write transaction; if it rolls back, the session forgets the objects it recorded."""
    try:
        with write_transaction(session.conn):
            yield
    except BaseException:
        session.forget_objects()
        raise


def _changes_of(transaction: SourceTransaction) -> Changes:
    return lambda: transaction.changes


def _scan(kind: SourceKind, metadata: SourceMetadata, changes: Changes, catalog: Catalog,
          session: Session) -> set[str]:
    """Check every change (InvalidArgument naming the first bad one, before anything is
    written), refuse the database's own tables (their records come from their own commits,
    CS-1), and record each object's column types; return the tables touched."""
    tables: dict[str, object] = {}
    count = 0
    for index, change in enumerate(changes()):
        validate_change(kind, metadata, index, change)
        if tables.get(change.table) is not change.column_types:
            if change.table in catalog.tables:
                raise InvalidArgument(
                    f"table {change.table!r} is a table of this database: its change records "
                    "come from its own commits (CS-1), not from appended source transactions")
            if session.object_types.get(change.table) is not change.column_types:
                _remember(session, change.table, change.column_types)
            tables[change.table] = change.column_types
        count += 1
    if count == 0:
        raise InvalidArgument("a source transaction needs at least one change")
    return set(tables)


def _remember(session: Session, table: str, column_types: tuple[ColumnTypeInfo, ...]) -> None:
    """Record an object's column types in the log, unless they are the ones it holds."""
    text = json.dumps([c.to_dict() for c in column_types], sort_keys=True)
    if session.objects.get(table) != text:
        log.remember_object(session.conn, table, text)
        session.objects[table] = text
    session.object_types[table] = column_types
