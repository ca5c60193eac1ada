"""The shard/iterator stream API (SH-1..7) over the same per-partition log.

Enabling a table's stream (a table of the embedded database, or one an external source
appended) creates an internal change stream for that table; its partitions are the shards.
An iterator is an opaque text naming a position (commit time, record, mod) in one shard's
log; `get_stream_record` pages through one row change per returned record.
"""

from __future__ import annotations

import base64
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cdcflow.errors import InvalidArgument, NotFound, OutOfRange, show
from cdcflow.model.partitions import FINISHED, PartitionMetadata
from cdcflow.model.records import DataChangeRecord
from cdcflow.model.schema import MAX_RETENTION_MICROS, MIN_RETENTION_MICROS
from cdcflow.model.timestamps import MAX_MICROS, MIN_MICROS, format_rfc3339, from_micros, to_micros
from cdcflow.model.types import check_text, is_valid_text
from cdcflow.store import catalog as catalog_ops
from cdcflow.store import journal, log, partition_map
from cdcflow.store.ddl import StreamScope
from cdcflow.store.session import Session
from cdcflow.store.sqlite import read_transaction, write_transaction

_ACTIONS = {"INSERT": "PUT_ROW", "UPDATE": "UPDATE_ROW", "DELETE": "DELETE_ROW"}
_MAX_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class StreamInfo:
    stream_id: str
    table_name: str
    creation_time: datetime


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """SH-6: a shard with its parent, and the parent's sibling on a merge."""

    shard_id: str
    parent_id: str | None
    parent_sibling_id: str | None


@dataclass(frozen=True, slots=True)
class StreamDescription:
    stream_id: str
    table_name: str
    creation_time: datetime
    expiration_time: timedelta
    status: str
    shards: tuple[ShardInfo, ...]


@dataclass(frozen=True, slots=True)
class StreamRecord:
    """One row change: action (PUT_ROW, UPDATE_ROW, DELETE_ROW), key, and what changed."""

    action_type: str
    primary_key: dict[str, Any]
    columns: dict[str, Any]
    old_columns: dict[str, Any]
    commit_timestamp: datetime
    transaction_id: str
    record_sequence: str
    mod_index: int


def _encode_iterator(stream_id: str, shard_id: str, position: tuple[int, int, int]) -> str:
    text = json.dumps([stream_id, shard_id, *position])
    return base64.urlsafe_b64encode(text.encode()).decode()


_PAST_ALL = 1 << 62
"""The record sequence of a position after every record of its commit timestamp."""
_ITERATOR_RULE = "pass one that get_shard_iterator or get_stream_record returned"


def _decode_iterator(iterator: object) -> tuple[str, str, tuple[int, int, int]]:
    """The stream id, shard id and position (commit micros, record, mod) an iterator names;
    InvalidArgument naming it otherwise."""
    if not isinstance(iterator, str):
        raise InvalidArgument(f"shard iterator {show(iterator)} ({type(iterator).__name__}) "
                              f"is not a string; {_ITERATOR_RULE}")
    try:
        parts = json.loads(base64.urlsafe_b64decode(iterator))
    except (ValueError, RecursionError):
        parts = None
    if not _is_position(parts):
        raise InvalidArgument(f"shard iterator {show(iterator[:40])} is not a valid iterator; "
                              f"{_ITERATOR_RULE}")
    stream_id, shard_id, micros, seq, mod = parts
    return stream_id, shard_id, (micros, seq, mod)


def _is_position(parts: Any) -> bool:
    """Whether decoded parts are [stream id, shard id, micros, seq, mod] as the API writes
    them: valid text, then integers in the ranges of timestamps and sequences."""
    if not isinstance(parts, list) or len(parts) != 5:
        return False
    ids, numbers = parts[:2], parts[2:]
    return (all(isinstance(p, str) and is_valid_text(p) for p in ids)
            and all(type(n) is int for n in numbers)
            and MIN_MICROS - 1 <= numbers[0] <= MAX_MICROS
            and all(0 <= n <= _PAST_ALL for n in numbers[1:]))


def _missed_removed(session: Session, stream: str, shard_id: str,
                    position: tuple[int, int]) -> bool:
    """Whether retention removed records after `position` that were never read. Retention
    removes whole commits, so a position inside a removed commit (part of it unread) counts."""
    removed = log.expired_upto(session.conn, stream, shard_id)
    if removed is None:
        return False
    return removed > position[0] or (removed == position[0] and position[1] < _PAST_ALL)


def _shard_infos(shards: list[PartitionMetadata]) -> tuple[ShardInfo, ...]:
    """SH-6 shard entries; a parent that expired is no longer named (it holds nothing)."""
    listed = {s.token for s in shards}
    infos = []
    for shard in shards:
        parents = [p for p in shard.parent_tokens if p in listed]
        infos.append(ShardInfo(shard.token, parents[0] if parents else None,
                               parents[1] if len(parents) > 1 else None))
    return tuple(infos)


def _require_table(session: Session, catalog: catalog_ops.Catalog, table: str) -> bool:
    """Whether `table` is a table an external source appended (False: this database's own);
    NotFound when it is neither."""
    if table in catalog.tables:
        return False
    if table in log.known_objects(session.conn):
        return True
    raise NotFound(f"table {table!r} does not exist; tables are {sorted(catalog.tables)} and "
                   f"appended objects are {sorted(log.known_objects(session.conn))}")


class ShardApi(ABC):
    """Mixin for `Database`: UpdateTable, ListStreams, DescribeStream, GetShardIterator,
    GetStreamRecord."""

    initial_partition_count: int

    @abstractmethod
    def _session(self) -> Session:
        """This thread's database session."""

    @abstractmethod
    def _now_micros(self) -> int:
        """The clock's current time in microseconds."""

    def update_table(
        self,
        table: str,
        enable_stream: bool,
        expiration_time: timedelta = timedelta(hours=24),
    ) -> str | None:
        """Enable (returning the stream id) or disable a table's stream (SH-6, SH-3)."""
        micros = int(expiration_time / timedelta(microseconds=1))
        if enable_stream and not MIN_RETENTION_MICROS <= micros <= MAX_RETENTION_MICROS:
            raise InvalidArgument(
                f"expiration_time {expiration_time} is outside the allowed 1 hour to 30 days"
            )
        session = self._session()
        with write_transaction(session.conn):
            catalog = session.refresh()
            journal.settle(session, catalog)  # earlier commits render with the old streams
            external = _require_table(session, catalog, table)
            current = session.conn.execute(
                "SELECT stream_id, change_stream FROM _shard_streams "
                "WHERE table_name = ? AND disabled_micros IS NULL",
                (table,),
            ).fetchone()
            now = self._now_micros()
            if not enable_stream:
                if current is not None:
                    session.conn.execute(
                        "UPDATE _shard_streams SET disabled_micros = ? WHERE stream_id = ?",
                        (now, current[0]),
                    )
                    catalog_ops.drop_stream(session.conn, catalog, current[1])
                    catalog_ops.bump_schema_version(session.conn)
                return None
            if current is not None:
                self._set_expiration(session, catalog, current, micros)
                return str(current[0])
            return self._enable(session, catalog, table, micros, now, external)

    def _set_expiration(
        self, session: Session, catalog: catalog_ops.Catalog, current: Any, micros: int
    ) -> None:
        stream = catalog.stream(current[1])
        altered = json.dumps(stream.to_json() | {"retention_micros": micros})
        session.conn.execute(
            "UPDATE _streams SET definition = ? WHERE name = ?", (altered, stream.name)
        )
        session.conn.execute(
            "UPDATE _shard_streams SET expiration_micros = ? WHERE stream_id = ?",
            (micros, current[0]),
        )
        catalog_ops.bump_schema_version(session.conn)

    def _enable(
        self, session: Session, catalog: catalog_ops.Catalog, table: str, micros: int, now: int,
        external: bool,
    ) -> str:
        (count,) = session.conn.execute("SELECT COUNT(*) FROM _shard_streams").fetchone()
        name = f"{catalog_ops.INTERNAL_PREFIX}shard_{table}_{count + 1}"
        scope = StreamScope(for_all=False, tables=((table, None),))
        hours = f"{micros // 1_000_000}s"
        definition = catalog_ops.create_stream(
            session.conn,
            catalog,
            name,
            scope,
            (("retention_period", hours), ("value_capture_type", "OLD_AND_NEW_VALUES")),
            now,
            self.initial_partition_count,
            internal=True,
            external_tables=frozenset({table}) if external else frozenset(),
        )
        stream_id = f"{table}-{definition.created_micros}"
        session.conn.execute(
            "INSERT INTO _shard_streams(stream_id, table_name, change_stream, enabled_micros, "
            "expiration_micros, disabled_micros) VALUES (?, ?, ?, ?, ?, NULL)",
            (stream_id, table, name, definition.created_micros, micros),
        )
        catalog_ops.bump_schema_version(session.conn)
        return stream_id

    def list_streams(self, table: str | None = None) -> list[StreamInfo]:
        session = self._session()
        with read_transaction(session.conn):
            rows = session.conn.execute(
                "SELECT stream_id, table_name, enabled_micros FROM _shard_streams "
                "WHERE disabled_micros IS NULL AND (? IS NULL OR table_name = ?) "
                "ORDER BY enabled_micros",
                (table, table),
            ).fetchall()
        return [StreamInfo(s, t, from_micros(m)) for s, t, m in rows]

    def _stream_row(self, session: Session, stream_id: str) -> tuple[str, str, int, int]:
        check_text(stream_id, "stream id")
        row = session.conn.execute(
            "SELECT table_name, change_stream, enabled_micros, expiration_micros "
            "FROM _shard_streams WHERE stream_id = ? AND disabled_micros IS NULL",
            (stream_id,),
        ).fetchone()
        if row is None:
            raise NotFound(f"stream {stream_id!r} does not exist or is disabled")
        return str(row[0]), str(row[1]), int(row[2]), int(row[3])

    def describe_stream(self, stream_id: str) -> StreamDescription:
        session = self._session()
        with read_transaction(session.conn):
            table, change_stream, enabled, expiration = self._stream_row(session, stream_id)
            partitions = partition_map.all_partitions(session.conn, change_stream)
        cutoff = from_micros(self._now_micros() - expiration)
        kept = [p for p in partitions if p.end_timestamp is None or p.end_timestamp > cutoff]
        return StreamDescription(
            stream_id,
            table,
            from_micros(enabled),
            timedelta(microseconds=expiration),
            "ACTIVE",
            _shard_infos(kept),
        )

    def get_shard_iterator(self, stream_id: str, shard_id: str) -> str:
        """An iterator at the oldest retained record of the shard."""
        check_text(shard_id, "shard id")
        session = self._session()
        with read_transaction(session.conn):
            _, change_stream, _, expiration = self._stream_row(session, stream_id)
            shard = partition_map.get_partition(session.conn, change_stream, shard_id)
        first = max(to_micros(shard.start_timestamp), self._now_micros() - expiration)
        return _encode_iterator(stream_id, shard_id, (first - 1, _PAST_ALL, 1 << 30))

    def get_stream_record(
        self, iterator: str, limit: int = 1_000
    ) -> tuple[list[StreamRecord], str | None]:
        """Up to `limit` row changes after the iterator, and the next iterator (None once a
        finished shard is read to its end, SH-7)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= _MAX_LIMIT:
            raise InvalidArgument(f"limit {show(limit)} must be an integer in 1..{_MAX_LIMIT}")
        stream_id, shard_id, (micros, seq, mod) = _decode_iterator(iterator)
        session = self._session()
        journal.settle_pending(session)
        with read_transaction(session.conn):
            _, change_stream, _, expiration = self._stream_row(session, stream_id)
            shard = partition_map.get_partition(session.conn, change_stream, shard_id)
            if _missed_removed(session, change_stream, shard_id, (micros, seq)):
                cutoff = self._now_micros() - expiration
                raise OutOfRange(
                    f"shard iterator points at {format_rfc3339(max(micros, 0))}, and records "
                    f"after it passed the stream's expiration and were removed unread; the "
                    f"earliest valid time is {format_rfc3339(cutoff)}: call get_shard_iterator "
                    "again"
                )
            rows = log.records_after(session.conn, change_stream, shard_id, (micros, seq - 1),
                                     journal.read_bound(session.conn, None), limit + 1)
        records, following = self._page(stream_id, shard_id, (micros, seq, mod), rows, limit)
        if following is not None and shard.state == FINISHED and len(rows) <= limit \
                and len(records) < limit:
            return records, None  # its child record expired: the shard still ended (SH-7)
        return records, following

    def _page(
        self,
        stream_id: str,
        shard_id: str,
        position: tuple[int, int, int],
        rows: list[Any],
        limit: int,
    ) -> tuple[list[StreamRecord], str | None]:
        records: list[StreamRecord] = []
        for row_micros, row_seq, kind, body in rows:
            if kind == log.LOG_CHILD:
                if len(records) < limit:
                    return records, None
                break
            record = DataChangeRecord.from_dict(json.loads(body))
            for index, mod in enumerate(record.mods):
                if (row_micros, row_seq, index) <= position:
                    continue
                if len(records) == limit:
                    return records, _encode_iterator(stream_id, shard_id, position)
                records.append(
                    StreamRecord(
                        _ACTIONS[record.mod_type],
                        mod.keys,
                        mod.new_values,
                        mod.old_values,
                        record.commit_timestamp,
                        record.server_transaction_id,
                        record.record_sequence,
                        index,
                    )
                )
                position = (row_micros, row_seq, index)
        return records, _encode_iterator(stream_id, shard_id, position)


