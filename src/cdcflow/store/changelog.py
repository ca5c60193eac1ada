"""`ChangeLog`: a change-log file, its partitioned change streams, and the writer API.

Every source lands here. The embedded database (`Database`, a subclass) appends the records of
its own commits inside them (CS-1); an external source's capture worker appends each committed
source transaction with `append`, together with the source's position after it, in one log
transaction. Readers (the query API, the shard API, the Spark source) see one log, whatever fed
it. `LogReader` is the part of this class that readers use, so that another backend (sealed
segment files, a networked store) can serve executors on other machines later.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Any, Protocol, Self

from cdcflow.clock import SYSTEM_CLOCK, Clock
from cdcflow.errors import FailedPrecondition, InvalidArgument, NotFound
from cdcflow.model.partitions import PartitionMetadata, PartitionPolicy
from cdcflow.model.records import ChangeRecord
from cdcflow.model.schema import ChangeStreamDef
from cdcflow.model.timestamps import as_datetime, from_micros, to_micros
from cdcflow.store import catalog as catalog_ops
from cdcflow.store import journal, log, partition_map, retention
from cdcflow.store.bulk_reads import BulkReads
from cdcflow.store.catalog import next_commit_micros
from cdcflow.store.checkpoint import BackgroundCheckpoints
from cdcflow.store.ddl import StreamScope
from cdcflow.store.query import parse_change_stream_query
from cdcflow.store.reader import initial_partitions, read_partition, validate_query
from cdcflow.store.session import Session
from cdcflow.store.shards import ShardApi
from cdcflow.store.sqlite import (
    check_format,
    file_format,
    initialise,
    read_meta,
    read_transaction,
    write_meta,
    write_transaction,
)
from cdcflow.store.writer import LogWriter


class LogReader(Protocol):
    """What readers of a change log need: its streams, partitions, safe time and records."""

    clock: Clock

    def change_stream(self, name: str) -> ChangeStreamDef: ...

    def partitions(self, stream: str, ending_after: int | None = None
                   ) -> list[PartitionMetadata]: ...

    def current_timestamp(self) -> datetime: ...

    def earliest_readable(self, stream: str) -> datetime: ...

    def close_until(self, when: datetime) -> datetime: ...

    def read_log_bodies(
        self, stream: str, token: str, after: datetime, until: datetime
    ) -> Iterator[tuple[str, dict[str, Any]]]: ...

    def read_log_entries(
        self, stream: str, token: str, after: datetime, until: datetime
    ) -> Iterator[tuple[str, int, dict[str, Any]]]: ...

    def read_log_texts(
        self, stream: str, token: str, after: datetime, until: datetime
    ) -> Iterator[tuple[str, int, str]]: ...

    def log_mod_counts(
        self, stream: str, token: str, after: datetime, until: datetime, limit: int
    ) -> list[tuple[int, int]]: ...

    def log_admission_counts(
        self, stream: str, tokens: list[str], after: datetime, until: datetime, max_mods: int
    ) -> tuple[int, list[tuple[int, int]]]: ...

    def log_mod_total(self, stream: str, token: str, after: datetime, until: datetime
                      ) -> int: ...


class ChangeLog(LogWriter, ShardApi, BulkReads):
    """A change-log file; open it with `ChangeLog.open(path)`. Safe for many processes.
    Its writer is `LogWriter`'s `append`; its shard/iterator API is `ShardApi`'s; its
    planned reads of log ranges are `BulkReads`'."""

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
    ) -> Self:
        """Open the file at `path`, creating it if missing (`create=False`: NotFound).

        A file of an older format is brought up to this one; a newer one is refused.
        `partition_policy`, when given, is stored in the file and used by every process.
        `initial_partitions` is how many partitions a new change stream starts with.
        """
        if initial_partitions < 1:
            raise InvalidArgument(f"initial_partitions {initial_partitions} must be at least 1")
        location = os.fspath(path)
        if not create and not os.path.exists(location):
            raise NotFound(f"database file {location!r} does not exist")
        if create:
            os.makedirs(os.path.dirname(os.path.abspath(location)), exist_ok=True)
        opened = cls(location, clock or SYSTEM_CLOCK, initial_partitions)
        conn = opened._session().conn
        with read_transaction(conn):
            has_meta = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE name = '_meta'").fetchone()
            meta = read_meta(conn) if has_meta else {}
        if not create and not has_meta:
            raise FailedPrecondition(f"{location!r} is not a cdcflow database (no _meta table)")
        check_format(meta)
        if create or file_format(meta) < log.FORMAT_VERSION:
            initialise(conn)
        if create:
            opened._store_policy(partition_policy)
        return opened

    def _store_policy(self, policy: PartitionPolicy | None) -> None:
        conn = self._session().conn
        with write_transaction(conn):
            stored = conn.execute(
                "SELECT value FROM _meta WHERE key = 'partition_policy'").fetchone()
            if policy is not None or stored is None:
                write_meta(conn, {"partition_policy": json.dumps(
                    (policy or PartitionPolicy()).to_json())})

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

    def checkpoints_in_background(self) -> BackgroundCheckpoints:
        """`with log.checkpoints_in_background():` this thread's appends leave copying the WAL
        into the file to a thread of its own (for a worker that appends all the time)."""
        return BackgroundCheckpoints(self.path, self._session().conn)

    def _catalog(self) -> catalog_ops.Catalog:
        session = self._session()
        with read_transaction(session.conn):
            return session.refresh()

    # ---- change streams -----------------------------------------------------------------

    def change_stream(self, name: str) -> ChangeStreamDef:
        return self._catalog().stream(name)

    def change_streams(self) -> list[str]:
        return sorted(
            s for s in self._catalog().streams if not s.startswith(catalog_ops.INTERNAL_PREFIX)
        )

    def ensure_change_stream(self, name: str, retention_period: str = "1d") -> ChangeStreamDef:
        """The change stream `name` FOR ALL, created if missing: an external source's log."""
        session = self._session()
        with write_transaction(session.conn):
            catalog = session.refresh()
            if name in catalog.streams:
                return catalog.streams[name]
            journal.settle(session, catalog)  # earlier commits render without the new stream
            options = (("retention_period", retention_period),
                       ("value_capture_type", "NEW_ROW"))
            created = catalog_ops.create_stream(
                session.conn, catalog, name, StreamScope(for_all=True, tables=()), options,
                self._now_micros(), self.initial_partition_count)
            catalog_ops.bump_schema_version(session.conn)
            return created

    # ---- reads --------------------------------------------------------------------------

    def current_timestamp(self) -> datetime:
        """The safe time: every commit at or before it is visible now, none will come later."""
        return from_micros(self._settled_safe_micros())

    def _settled_safe_micros(self) -> int:
        """The journal settled, the safe time of a fresh snapshot."""
        session = self._session()
        journal.settle_pending(session)
        with read_transaction(session.conn):
            return journal.safe_micros(session.conn)

    def _publish_closed(self, micros: int) -> int:
        """Promise that no commit will have a timestamp <= `micros`; return the safe time."""
        safe = self._settled_safe_micros()
        if safe >= micros:
            return safe
        session = self._session()
        with write_transaction(session.conn):
            journal.settle(session, session.refresh())
            meta = session.meta
            closed = max(int(meta["closed_micros"]), micros)
            write_meta(session.conn, {"closed_micros": closed})
            return max(closed, int(meta["last_commit_micros"]))

    def close_until(self, when: datetime) -> datetime:
        """Close every timestamp up to `when` (not beyond now); return the new safe time."""
        micros = min(to_micros(when), self._now_micros())
        return from_micros(self._publish_closed(micros))

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
        args = validate_query(self._session(), stream, start, end, partition_token,
                              heartbeat_milliseconds, self._now_micros())
        if partition_token is None:
            return iter([initial_partitions(self._session(), args)])
        return read_partition(self._session(), self.clock, args, self._publish_closed)

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
        records = self.read_change_stream(query.stream, query.start_timestamp,
                                          query.end_timestamp, query.partition_token,
                                          query.heartbeat_milliseconds)
        return (([record],) for record in records)

    # ---- partitions ---------------------------------------------------------------------

    def partitions(self, stream: str, ending_after: int | None = None
                   ) -> list[PartitionMetadata]:
        """Every partition of `stream`, finished ones included, oldest first. With
        `ending_after` (micros), only those active or ending after it: what a reader that
        consumed everything up to it can still meet, however long the lineage behind."""
        session = self._session()
        with read_transaction(session.conn):
            session.refresh().stream(stream)
            return partition_map.all_partitions(session.conn, stream, ending_after)

    def split_partition(self, stream: str, token: str, at: int | None = None) -> tuple[str, str]:
        """Split an active partition at hash position `at` (default: its midpoint)."""
        session = self._session()
        with write_transaction(session.conn):
            journal.settle(session, session.refresh())
            session.catalog.stream(stream)
            micros = next_commit_micros(session.conn, self._now_micros())
            return partition_map.split(session.conn, stream, token, at, micros)

    def merge_partitions(self, stream: str, tokens: list[str]) -> str:
        """Merge two adjacent active partitions into one child."""
        session = self._session()
        with write_transaction(session.conn):
            journal.settle(session, session.refresh())
            session.catalog.stream(stream)
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
        with write_transaction(session.conn):
            write_meta(session.conn, {"partition_policy": json.dumps(policy.to_json())})

    def enforce_retention(self) -> dict[str, int]:
        """Remove expired change records and row versions now; return how many went."""
        session = self._session()
        with write_transaction(session.conn):
            catalog = session.refresh()
            journal.settle(session, catalog)
            now = self._now_micros()
            return {
                "change_records": retention.expire_change_records(session.conn, catalog, now),
                "row_versions": retention.expire_row_versions(session.conn, catalog, now),
            }


def open_log(location: str) -> ChangeLog:
    """A reader's handle on an existing change log (a file path today)."""
    return ChangeLog.open(location, create=False)
