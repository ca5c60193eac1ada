"""`BulkReads`: the reads of whole ranges of a partition's log that planned readers make (the
Spark source and its admission control), with the rules they share: the start inside
retention, the journal settled up to the end, and nothing read past a commit still in it.
A mixin of `ChangeLog`."""

from __future__ import annotations

import contextlib
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import orjson

from cdcflow.errors import OutOfRange
from cdcflow.model.schema import ChangeStreamDef
from cdcflow.model.timestamps import format_rfc3339, from_micros, to_micros
from cdcflow.store import journal, log, record_types
from cdcflow.store.reader import scan_log
from cdcflow.store.session import Session
from cdcflow.store.sqlite import read_transaction


class BulkReads(ABC):
    """Mixin of `ChangeLog`: planned reads of log ranges, and the counts that plan them."""

    @abstractmethod
    def _session(self) -> Session:
        """This thread's session."""

    @abstractmethod
    def _now_micros(self) -> int:
        """The clock's current time in microseconds."""

    @abstractmethod
    def change_stream(self, name: str) -> ChangeStreamDef:
        """The definition of a change stream."""

    def read_log_bodies(
        self, stream: str, token: str, after: datetime, until: datetime
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Records of one partition with after < commit_timestamp <= until as parsed dicts
        (the `to_dict()` shape), tagged "data" or "child". A bulk path for planned reads:
        `until` must not exceed `current_timestamp()`; the start must be inside retention."""
        for kind, _, record in self.read_log_entries(stream, token, after, until):
            yield kind, record

    def read_log_entries(
        self, stream: str, token: str, after: datetime, until: datetime
    ) -> Iterator[tuple[str, int, dict[str, Any]]]:
        """`read_log_bodies` with each record's commit timestamp in microseconds."""
        for kind, micros, body in self.read_log_texts(stream, token, after, until):
            yield kind, micros, orjson.loads(body)

    def read_log_texts(
        self, stream: str, token: str, after: datetime, until: datetime
    ) -> Iterator[tuple[str, int, str]]:
        """`read_log_entries` with each body as JSON text."""
        for kind, micros, body, types in self.read_log_parts(stream, token, after, until):
            yield kind, micros, body if types is None else record_types.joined(types, body)

    def read_log_parts(
        self, stream: str, token: str, after: datetime, until: datetime
    ) -> Iterator[tuple[str, int, str, str | None]]:
        """`read_log_texts` with each data record's column types apart, as the log keeps
        them (`cdcflow.store.record_types`): (kind, micros, body, column types text or None
        when the body is whole)."""
        start = to_micros(after) + 1
        earliest = to_micros(self.earliest_readable(stream))
        if start < earliest:
            raise OutOfRange(
                f"start {format_rfc3339(start)} is outside the retention of change stream "
                f"{stream!r}; the earliest valid timestamp is {format_rfc3339(earliest)}"
            )
        for kind, micros, body, types in scan_log(self._session(), stream, token, start - 1,
                                                  to_micros(until)):
            yield ("child" if kind == log.LOG_CHILD else "data"), micros, body, types

    def earliest_readable(self, stream: str) -> datetime:
        """The earliest start_timestamp a query of `stream` may use now (CS-5)."""
        definition = self.change_stream(stream)
        now = self._now_micros()
        return from_micros(max(definition.created_micros, now - definition.retention_micros))

    @contextlib.contextmanager
    def _reading_up_to(self, until: datetime) -> Iterator[tuple[sqlite3.Connection, int]]:
        """A read snapshot for records up to `until`, the journal settled that far first:
        its connection, and the bound cut before any commit still in the journal."""
        session = self._session()
        journal.settle_pending(session, to_micros(until))
        with read_transaction(session.conn):
            yield session.conn, journal.readable_micros(session.conn, to_micros(until))

    def log_mod_counts(
        self, stream: str, token: str, after: datetime, until: datetime, limit: int
    ) -> list[tuple[int, int]]:
        """(commit micros, mods) of the first `limit` data records of a partition with
        after < commit_timestamp <= until, in commit order: for admission control."""
        with self._reading_up_to(until) as (conn, bound):
            return log.mod_counts(conn, stream, token, to_micros(after), bound, limit)

    def log_mod_total(self, stream: str, token: str, after: datetime, until: datetime
                      ) -> int:
        """The mods of a partition's data records with after < commit_timestamp <= until."""
        with self._reading_up_to(until) as (conn, bound):
            return log.mod_total(conn, stream, token, to_micros(after), bound)

    def log_admission_counts(
        self, stream: str, tokens: list[str], after: datetime, until: datetime, max_mods: int
    ) -> tuple[int, list[tuple[int, int]]]:
        """A bound and the mods per commit up to it, for a batch of about `max_mods` mods
        over partitions `tokens` (see `log.admission_counts`), in one snapshot."""
        with self._reading_up_to(until) as (conn, bound):
            return log.admission_counts(conn, stream, tokens, to_micros(after), bound,
                                        max_mods)
