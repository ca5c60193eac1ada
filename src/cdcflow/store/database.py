"""`Database`: the embedded database with native change streams, on one SQLite file.

Many processes may open the same file at once, as writers and readers. See the README for the
model: versioned rows, change records written in the commit's own SQLite transaction (CS-1),
partitions over a key hash that split and merge (CS-2), and the READ_<stream> query (CS-5).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import orjson

from cdcflow.clock import SYSTEM_CLOCK, Clock
from cdcflow.errors import InvalidArgument, NotFound, OutOfRange
from cdcflow.model.partitions import PartitionMetadata, PartitionPolicy
from cdcflow.model.records import ChangeRecord
from cdcflow.model.schema import ChangeStreamDef, TableSchema, key_hash
from cdcflow.model.timestamps import as_datetime, format_rfc3339, from_micros, to_micros
from cdcflow.store import catalog as catalog_ops
from cdcflow.store import partition_map, retention, rows, shards
from cdcflow.store.catalog import next_commit_micros
from cdcflow.store.commit import commit_mutations
from cdcflow.store.ddl import parse_ddl
from cdcflow.store.mutations import Mutation
from cdcflow.store.query import parse_change_stream_query
from cdcflow.store.reader import initial_partitions, read_partition, scan_log, validate_query
from cdcflow.store.session import Session
from cdcflow.store.sqlite import (
    LOG_CHILD,
    initialise,
    read_meta,
    read_transaction,
    write_meta,
)
from cdcflow.store.sqlite import write_transaction as _write_transaction
from cdcflow.store.transaction import Transaction


class Database(shards.ShardApi):
    """An embedded database file with change streams; open it with `Database.open(path)`."""

    def __init__(self, path: str, clock: Clock, initial_partition_count: int) -> None:
        self.path = path
        self.clock = clock
        self.initial_partition_count = initial_partition_count
        self._local = threading.local()
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the location and settings only; connections are per process and thread."""
        return {"path": self.path, "clock": self.clock, "initial": self.initial_partition_count}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["clock"], state["initial"])  # type: ignore[misc]

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        partition_policy: PartitionPolicy | None = None,
        initial_partitions: int = 1,
        create: bool = True,
    ) -> Database:
        """Open the database at `path`, creating it if missing (`create=False`: NotFound).

        `partition_policy`, when given, is stored in the file and used by every process.
        `initial_partitions` is how many partitions a new change stream starts with.
        """
        if initial_partitions < 1:
            raise InvalidArgument(f"initial_partitions {initial_partitions} must be at least 1")
        location = os.fspath(path)
        if not create:
            if not os.path.exists(location):
                raise NotFound(f"database file {location!r} does not exist")
            return cls(location, clock or SYSTEM_CLOCK, initial_partitions)
        os.makedirs(os.path.dirname(os.path.abspath(location)), exist_ok=True)
        database = cls(location, clock or SYSTEM_CLOCK, initial_partitions)
        conn = database._session().conn
        initialise(conn)
        with _write_transaction(conn):
            stored = conn.execute(
                "SELECT value FROM _meta WHERE key = 'partition_policy'"
            ).fetchone()
            if partition_policy is not None or stored is None:
                policy = json.dumps((partition_policy or PartitionPolicy()).to_json())
                conn.execute(
                    "INSERT OR REPLACE INTO _meta(key, value) VALUES ('partition_policy', ?)",
                    (policy,),
                )
        return database

    def _session(self) -> Session:
        """This thread's connection (a forked child opens its own)."""
        session: Session | None = getattr(self._local, "session", None)
        if session is None or self._pid != os.getpid():
            self._pid = os.getpid()
            session = Session.open(self.path)
            self._local.session = session
        return session

    def _now_micros(self) -> int:
        return to_micros(self.clock.now())

    def close(self) -> None:
        session: Session | None = getattr(self._local, "session", None)
        if session is not None:
            session.conn.close()
            self._local.session = None

    # ---- schema -------------------------------------------------------------------------

    def ddl(self, statements: str | list[str]) -> None:
        """Apply DDL statements, each atomically; a bad statement raises and changes nothing."""
        for text in [statements] if isinstance(statements, str) else statements:
            statement = parse_ddl(text)
            session = self._session()
            with _write_transaction(session.conn):
                catalog = session.refresh()
                catalog_ops.apply_statement(
                    session.conn,
                    catalog,
                    statement,
                    self._now_micros(),
                    self.initial_partition_count,
                )

    def _catalog(self) -> catalog_ops.Catalog:
        session = self._session()
        with read_transaction(session.conn):
            return session.refresh()

    def table_schema(self, table: str) -> TableSchema:
        cached = self._session().catalog
        if table in cached.tables:
            return cached.tables[table][0]
        return self._catalog().table(table)

    def tables(self) -> list[str]:
        return sorted(self._catalog().tables)

    def change_stream(self, name: str) -> ChangeStreamDef:
        return self._catalog().stream(name)

    def change_streams(self) -> list[str]:
        return sorted(
            s for s in self._catalog().streams if not s.startswith(catalog_ops.INTERNAL_PREFIX)
        )

    # ---- writes -------------------------------------------------------------------------

    def transaction(self) -> Transaction:
        return Transaction(self)

    def _commit(self, mutations: list[Mutation]) -> datetime:
        return from_micros(commit_mutations(self._session(), mutations, self._now_micros()))

    # ---- reads --------------------------------------------------------------------------

    def current_timestamp(self) -> datetime:
        """The safe time: every commit at or before it is visible now, none will come later."""
        session = self._session()
        with read_transaction(session.conn):
            meta = read_meta(session.conn)
        return from_micros(max(int(meta["last_commit_micros"]), int(meta["closed_micros"])))

    def _normalise_key(self, schema: TableSchema, key: Any) -> tuple[Any, ...]:
        if isinstance(key, dict):
            return tuple(key[name] for name in schema.primary_key)
        values = tuple(key) if isinstance(key, tuple | list) else (key,)
        if len(values) != len(schema.primary_key):
            raise InvalidArgument(
                f"key {key!r} has {len(values)} parts; table {schema.name!r} has primary key "
                f"{list(schema.primary_key)}"
            )
        return values

    def read_row(
        self, table: str, key: Any, read_timestamp: datetime | str | None = None
    ) -> dict[str, Any] | None:
        """The row with primary key `key` (a value, tuple or dict), or None if absent."""
        session = self._session()
        at = self._read_micros(read_timestamp)
        with read_transaction(session.conn):
            catalog = session.refresh()
            schema = catalog.table(table)
            encoded_key = schema.encode_key(self._normalise_key(schema, key))
            found = rows.latest_version(session.conn, catalog.storage(table), encoded_key, at)
        return None if found is None else rows.decode_row(schema, found)

    def scan(
        self,
        table: str,
        read_timestamp: datetime | str | None = None,
        key_hash_range: tuple[int, int] | None = None,
    ) -> list[dict[str, Any]]:
        """Every live row at `read_timestamp` (default: now), in one consistent snapshot.

        `key_hash_range` restricts the scan to [start, end) of the partition hash space, so
        parallel readers can split a table and still see the same snapshot.
        """
        session = self._session()
        at = self._read_micros(read_timestamp)
        with read_transaction(session.conn):
            catalog = session.refresh()
            schema = catalog.table(table)
            at = at if at is not None else int(session.meta["last_commit_micros"])
            start, end = key_hash_range if key_hash_range else (0, None)
            found = list(rows.scan_versions(session.conn, catalog.storage(table), at, start, end))
        return [rows.decode_row(schema, r) for r in found]

    def _read_micros(self, read_timestamp: datetime | str | None) -> int | None:
        """Validate a read timestamp and make it safe: close it so no commit can land at or
        before it after the read starts."""
        if read_timestamp is None:
            return None
        micros = to_micros(as_datetime(read_timestamp))
        now = self._now_micros()
        if micros > now:
            raise InvalidArgument(
                f"read_timestamp {format_rfc3339(micros)} is in the future (now is "
                f"{format_rfc3339(now)})"
            )
        earliest = now - retention.VERSION_RETENTION_MICROS
        if micros < earliest:
            raise OutOfRange(
                f"read_timestamp {format_rfc3339(micros)} is older than the version retention "
                f"of 1 hour; the earliest valid timestamp is {format_rfc3339(earliest)}"
            )
        self._publish_closed(micros)
        return micros

    def _publish_closed(self, micros: int) -> int:
        """Promise that no commit will have a timestamp <= `micros`; return the safe time."""
        session = self._session()
        with read_transaction(session.conn):
            meta = read_meta(session.conn)
        safe = max(int(meta["last_commit_micros"]), int(meta["closed_micros"]))
        if safe >= micros:
            return safe
        with _write_transaction(session.conn):
            meta = read_meta(session.conn)
            closed = max(int(meta["closed_micros"]), micros)
            write_meta(session.conn, {"closed_micros": closed})
            return max(closed, int(meta["last_commit_micros"]))

    def _publish_closed_until(self, when: datetime) -> datetime:
        """Close every timestamp up to `when` (not beyond now); return the new safe time."""
        micros = min(to_micros(when), self._now_micros())
        return from_micros(self._publish_closed(micros))

    # ---- change streams -----------------------------------------------------------------

    def read_change_stream(
        self,
        stream: str,
        start_timestamp: datetime | str,
        end_timestamp: datetime | str | None = None,
        partition_token: str | None = None,
        heartbeat_milliseconds: int = 10_000,
    ) -> Iterator[ChangeRecord]:
        """READ_<stream>(...): validate now (CS-5), then yield records lazily."""
        start = to_micros(as_datetime(start_timestamp))
        end = None if end_timestamp is None else to_micros(as_datetime(end_timestamp))
        args = validate_query(
            self._session(),
            stream,
            start,
            end,
            partition_token,
            heartbeat_milliseconds,
            self._now_micros(),
        )
        if partition_token is None:
            return iter([initial_partitions(self._session(), args)])
        return read_partition(self._session(), self.clock, args, self._publish_closed)

    def read_log_bodies(
        self, stream: str, token: str, after: datetime, until: datetime
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Records of one partition with after < commit_timestamp <= until as parsed dicts
        (the `to_dict()` shape), tagged "data" or "child". A bulk path for planned reads:
        `until` must not exceed `current_timestamp()`; the start must be inside retention."""
        start = to_micros(after) + 1
        earliest = to_micros(self.earliest_readable(stream))
        if start < earliest:
            raise OutOfRange(
                f"start {format_rfc3339(start)} is outside the retention of change stream "
                f"{stream!r}; the earliest valid timestamp is {format_rfc3339(earliest)}"
            )
        for kind, body in scan_log(self._session(), stream, token, start - 1, to_micros(until)):
            yield ("child" if kind == LOG_CHILD else "data"), orjson.loads(body)

    def execute_sql(
        self,
        sql: str,
        params: dict[str, Any] | None = None,
        transaction: str = "single_use_strong_read_only",
    ) -> Iterator[tuple[list[ChangeRecord]]]:
        """Run a change-stream query `SELECT ChangeRecord FROM READ_<stream>(...)`.

        Each result row is a 1-tuple holding the ChangeRecord column: a list of one
        `ChangeRecord` (Spanner's ARRAY<STRUCT> of one element). Only single-use strong
        read-only transactions are valid (CS-10).
        """
        if transaction != "single_use_strong_read_only":
            raise InvalidArgument(
                f"transaction {transaction!r} is invalid for change stream queries; only "
                "'single_use_strong_read_only' is allowed (CS-10)"
            )
        query = parse_change_stream_query(sql, params or {})
        records = self.read_change_stream(
            query.stream,
            query.start_timestamp,
            query.end_timestamp,
            query.partition_token,
            query.heartbeat_milliseconds,
        )
        return (([record],) for record in records)

    def earliest_readable(self, stream: str) -> datetime:
        """The earliest start_timestamp a query of `stream` may use now (CS-5)."""
        definition = self.change_stream(stream)
        now = self._now_micros()
        return from_micros(max(definition.created_micros, now - definition.retention_micros))

    def log_mod_counts(
        self, stream: str, token: str, after: datetime, until: datetime, limit: int
    ) -> list[tuple[int, int]]:
        """(commit micros, mods) of the first `limit` data records of a partition with
        after < commit_timestamp <= until, in commit order: for admission control."""
        session = self._session()
        with read_transaction(session.conn):
            rows = session.conn.execute(
                "SELECT commit_micros, mods FROM _log WHERE stream = ? AND token = ? "
                "AND kind = 0 AND commit_micros > ? AND commit_micros <= ? "
                "ORDER BY commit_micros, seq LIMIT ?",
                (stream, token, to_micros(after), to_micros(until), limit),
            ).fetchall()
        return [(int(m), int(n)) for m, n in rows]

    # ---- partitions ---------------------------------------------------------------------

    def partitions(self, stream: str) -> list[PartitionMetadata]:
        """Every partition of `stream`, finished ones included, oldest first."""
        session = self._session()
        with read_transaction(session.conn):
            session.refresh().stream(stream)
            return partition_map.all_partitions(session.conn, stream)

    def split_partition(self, stream: str, token: str, at: int | None = None) -> tuple[str, str]:
        """Split an active partition at hash position `at` (default: its midpoint)."""
        session = self._session()
        with _write_transaction(session.conn):
            session.refresh().stream(stream)
            micros = next_commit_micros(session.conn, self._now_micros())
            return partition_map.split(session.conn, stream, token, at, micros)

    def merge_partitions(self, stream: str, tokens: list[str]) -> str:
        """Merge two adjacent active partitions into one child."""
        session = self._session()
        with _write_transaction(session.conn):
            session.refresh().stream(stream)
            micros = next_commit_micros(session.conn, self._now_micros())
            return partition_map.merge(session.conn, stream, list(tokens), micros)

    @property
    def partition_policy(self) -> PartitionPolicy:
        session = self._session()
        with read_transaction(session.conn):
            session.refresh()
        return PartitionPolicy.from_json(json.loads(session.meta["partition_policy"]))

    def set_partition_policy(self, policy: PartitionPolicy) -> None:
        session = self._session()
        with _write_transaction(session.conn):
            session.conn.execute(
                "UPDATE _meta SET value = ? WHERE key = 'partition_policy'",
                (json.dumps(policy.to_json()),),
            )

    def enforce_retention(self) -> dict[str, int]:
        """Remove expired change records and row versions now; return how many went."""
        session = self._session()
        with _write_transaction(session.conn):
            catalog = session.refresh()
            now = self._now_micros()
            return {
                "change_records": retention.expire_change_records(session.conn, catalog, now),
                "row_versions": retention.expire_row_versions(session.conn, catalog, now),
            }

    def key_hash(self, table: str, key: Any) -> int:
        """Position of a row in the partition hash space, e.g. to choose a split point."""
        schema = self.table_schema(table)
        return key_hash(table, schema.encode_key(self._normalise_key(schema, key)))

    def partition_of(self, stream: str, table: str, key: Any) -> str:
        """Token of the active partition of `stream` that holds `key` of `table`."""
        position = self.key_hash(table, key)
        for partition in self.partitions(stream):
            if partition.state == "ACTIVE" and partition.key_range.contains(position):
                return partition.token
        raise AssertionError("active partitions cover the whole hash space")
