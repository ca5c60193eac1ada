"""PostgreSQL as a `ChangeSource`: a publication and a logical replication slot (pgoutput),
a backfill from the snapshot the slot exports, and a capture worker into the change log.

The slot is created with EXPORT_SNAPSHOT: the backfill reads every table in that snapshot
(`SET TRANSACTION SNAPSHOT`), and the slot streams every transaction that committed after
it, so the two meet with no gap and no duplicate. A backfill cut short goes on where its last
chunk ended, in a newer snapshot: the slot still streams every change since the first one,
and whole-row changes applied over rows read later give the same rows (duplicate events are
possible then, as EV-7 allows; none are lost).
"""

from __future__ import annotations

import fnmatch
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg2
from psycopg2 import sql

from cdcflow.capture.postgres.catalog import PgTable, TypeCache, read_tables, source_object
from cdcflow.capture.postgres.connection import check_server_version, connect, typed
from cdcflow.capture.postgres.snapshot import read_chunk
from cdcflow.capture.postgres.stream import HEARTBEAT_PREFIX, CaptureLoop, Settings
from cdcflow.capture.source import RowSink, Snapshot, SourceObject, WorkerHooks
from cdcflow.clock import SYSTEM_CLOCK, Clock
from cdcflow.errors import FailedPrecondition, InvalidArgument, NotFound
from cdcflow.model.source import POSTGRES, lsn_number
from cdcflow.model.timestamps import from_micros, to_micros
from cdcflow.model.types import decode_value
from cdcflow.store.changelog import ChangeLog

CHANGE_STREAM = "changes"
CHUNK_ROWS = 5_000


@dataclass(frozen=True, slots=True)
class PostgresConfig:
    """A PostgreSQL source of one stream (see `streams.definition.PostgresSource`)."""

    dsn: str
    password_env: str | None
    slot: str
    publication: str
    log_path: str
    include: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ()
    heartbeat_seconds: float = 10.0
    primary_keys: dict[str, tuple[str, ...]] = field(default_factory=dict)
    numeric: dict[str, tuple[int, int]] = field(default_factory=dict)
    retained_wal_warning_bytes: int = 1024 * 1024 * 1024
    chunk_rows: int = CHUNK_ROWS

    def selects(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in self.include) and not any(
            fnmatch.fnmatchcase(name, p) for p in self.exclude)


SLOT_RELEASE_SECONDS, SLOT_RELEASE_POLL_SECONDS = 5.0, 0.2
"""How long dropping a slot waits for its reader to let go, and how often it looks."""


class PostgresSource:
    kind = POSTGRES
    has_worker = True

    def __init__(self, config: PostgresConfig, clock: Clock = SYSTEM_CLOCK,
                 hooks: WorkerHooks | None = None) -> None:
        self.config = config
        self.clock = clock
        self.hooks = hooks or WorkerHooks()
        self.source_id = f"postgres:{config.slot}"
        self._sql: Any = None
        self._exporter: Any = None  # the replication connection holding the snapshot
        self.slot_release_seconds = SLOT_RELEASE_SECONDS

    # ---- connections and the catalog ----------------------------------------------------

    def _conn(self) -> Any:
        if self._sql is None or self._sql.closed:
            conn = connect(self.config.dsn, self.config.password_env)
            try:
                check_server_version(conn, self.config.dsn)
            except FailedPrecondition:
                conn.close()
                raise
            self._sql = conn
        return self._sql

    def _tables(self) -> list[PgTable]:
        try:
            return read_tables(self._conn())
        except Exception as error:
            raise typed(error, "reading the tables of the catalog") from None

    def _objects(self, tables: list[PgTable]) -> list[SourceObject]:
        types = TypeCache()
        types.load(self._conn(), {c.type_oid for t in tables for c in t.columns})
        return [source_object(t, types, self.config.primary_keys.get(t.object_name),
                              {k.rsplit(".", 1)[1]: v for k, v in self.config.numeric.items()
                               if k.rsplit(".", 1)[0] == t.object_name})
                for t in tables]

    def discover(self) -> list[SourceObject]:
        return self._objects(self._tables())

    def log_location(self) -> tuple[str, str]:
        return self.config.log_path, CHANGE_STREAM

    # ---- the snapshot and the backfill ----------------------------------------------------

    def snapshot(self, objects: list[SourceObject], resume: dict[str, Any] | None) -> Snapshot:
        log = ChangeLog.open(self.config.log_path)
        log.ensure_change_stream(CHANGE_STREAM)
        if resume is not None:
            return Snapshot(self.clock.now(), resume, from_micros(int(resume["cdc_start"])))
        self._publish(objects)
        name, consistent = self._create_slot()
        cdc_start = log.current_timestamp() + timedelta(microseconds=1)
        log.forget_position(self.source_id)  # a new slot: its stream starts afresh
        return Snapshot(self.clock.now(), {"slot": self.config.slot, "snapshot": name,
                                           "consistent_lsn": consistent,
                                           "visible": self._pg_snapshot(name),
                                           "cdc_start": to_micros(cdc_start)}, cdc_start)

    def _pg_snapshot(self, exported: str) -> str:
        """The exported snapshot as a pg_snapshot (xmin:xmax:in-progress ids)."""
        conn = connect(self.config.dsn, self.config.password_env)
        conn.autocommit = False
        try:
            with conn.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                cur.execute("SET TRANSACTION SNAPSHOT %s", (exported,))
                cur.execute("SELECT pg_current_snapshot()::text")
                (text,) = cur.fetchone()
            return str(text)
        finally:
            conn.rollback()
            conn.close()

    def _publish(self, objects: list[SourceObject]) -> None:
        tables = [sql.SQL(".").join(map(sql.Identifier, o.name.split(".", 1)))
                  for o in objects]
        if not tables:
            raise InvalidArgument("the stream selects no table of the source; check include "
                                  "and exclude")
        name = sql.Identifier(self.config.publication)
        with self._conn().cursor() as cur:
            cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s",
                        (self.config.publication,))
            exists = cur.fetchone() is not None
            cur.execute("SELECT schemaname || '.' || tablename FROM pg_publication_tables "
                        "WHERE pubname = %s", (self.config.publication,))
            if exists and {o.name for o in objects} <= {r[0] for r in cur.fetchall()}:
                return  # e.g. made by an administrator for the user: nothing to change
            verb = "ALTER PUBLICATION {} SET TABLE {}" if exists else \
                "CREATE PUBLICATION {} FOR TABLE {}"
            try:
                cur.execute(sql.SQL(verb).format(name, sql.SQL(", ").join(tables)))
            except Exception as error:
                raise typed(error, f"creating publication {self.config.publication!r}") \
                    from None

    def _create_slot(self) -> tuple[str, str]:
        self.drop_slot()
        self._exporter = connect(self.config.dsn, self.config.password_env, replication=True)
        try:
            with self._exporter.cursor() as cur:
                cur.execute(sql.SQL("CREATE_REPLICATION_SLOT {} LOGICAL pgoutput "
                                    "EXPORT_SNAPSHOT").format(
                    sql.Identifier(self.config.slot)))
                _, consistent, snapshot_name, _ = cur.fetchone()
        except Exception as error:
            raise typed(error, f"creating replication slot {self.config.slot!r}") from None
        return str(snapshot_name), str(consistent)

    def backfill(self, snapshot: Snapshot, objects: list[SourceObject], sink: RowSink,
                 resume: dict[str, Any] | None = None) -> None:
        conn = connect(self.config.dsn, self.config.password_env)
        conn.autocommit = False
        try:
            with conn.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                if self._exporter is not None:
                    cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot.position["snapshot"],))
            first = None if self._exporter is not None else snapshot.position.get("visible")
            for item in objects:
                after = (resume or {}).get(item.name)
                while after != "done":
                    rows, after, full = read_chunk(conn, item, after, first,
                                                     self.config.chunk_rows)
                    if rows:
                        sink(item, [_python(row, item) for row in rows], after)
                    after = after if full else "done"
        except psycopg2.Error as error:  # the sink's own errors (a destination's) go on as
            raise typed(error, "reading the snapshot") from None  # they are
        finally:
            conn.rollback()
            conn.close()

    def release(self, snapshot: Snapshot) -> None:
        if self._exporter is not None:
            self._exporter.close()
            self._exporter = None

    # ---- capture and removal --------------------------------------------------------------

    def capture(self, log: ChangeLog, stop: threading.Event) -> None:
        settings = Settings(self.source_id, self.config.slot, self.config.publication,
                            self.config.heartbeat_seconds, self.config.selects,
                            self.config.primary_keys, self.config.numeric, self.hooks.report,
                            self.hooks.requests, self.hooks.progress, self.config.chunk_rows)
        replication = connect(self.config.dsn, self.config.password_env, replication=True)
        reader = connect(self.config.dsn, self.config.password_env)
        try:
            with log.checkpoints_in_background():
                CaptureLoop(settings, log, replication, self._conn(), reader).run(stop)
        finally:
            replication.close()
            reader.close()

    def mark(self) -> str:
        """Put a marker into the slot's stream now; return its LSN (see `reached`)."""
        with self._conn().cursor() as cur:
            cur.execute("SELECT pg_logical_emit_message(false, %s, 'mark')::text",
                        (HEARTBEAT_PREFIX,))
            (lsn,) = cur.fetchone()
        return str(lsn)

    def reached(self, log: ChangeLog, mark: str) -> bool:
        """Whether the capture has put into `log` every transaction before `mark`."""
        stored = log.position(self.source_id)
        return stored is not None and lsn_number(stored.position["end_lsn"]) >= \
            lsn_number(mark)

    def status(self) -> dict[str, Any]:
        return self.slot_status() | {"warn_above": self.config.retained_wal_warning_bytes}

    def slot_status(self) -> dict[str, Any]:
        """The slot's retained WAL: the server's WAL position minus its confirmed flush.
        A server that went away (restarted, say) is Unavailable, and the next call connects
        again."""
        conn = self._conn()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT active, pg_wal_lsn_diff(pg_current_wal_lsn(), "
                            "confirmed_flush_lsn)::bigint, confirmed_flush_lsn::text "
                            "FROM pg_replication_slots WHERE slot_name = %s",
                            (self.config.slot,))
                row = cur.fetchone()
        except psycopg2.Error as error:
            conn.close()
            raise typed(error, f"reading the status of replication slot "
                               f"{self.config.slot!r}") from None
        if row is None:
            raise NotFound(f"replication slot {self.config.slot!r} does not exist")
        return {"slot": self.config.slot, "active": row[0], "retained_wal_bytes": row[1],
                "confirmed_flush_lsn": row[2]}

    def drop_slot(self) -> None:
        """Drop the stream's slot if there is one. A slot that a reader holds (a capture
        worker on its way out, say) is waited for up to `slot_release_seconds`, then refused
        with FailedPrecondition naming it and the server process that holds it: a slot left
        behind would keep the server's WAL forever."""
        deadline = self.clock.now() + timedelta(seconds=self.slot_release_seconds)
        while (holder := self._try_drop_slot()) is not None:
            if self.clock.now() >= deadline:
                raise FailedPrecondition(
                    f"replication slot {self.config.slot!r} is in use by server process "
                    f"{holder}, so it was not dropped; stop what reads it (a capture worker "
                    "of a runner that still runs?) and try again, or keep the slot")
            self.clock.sleep(SLOT_RELEASE_POLL_SECONDS)

    def _try_drop_slot(self) -> int | None:
        """Drop the slot unless a reader holds it; the holder's process id, else None."""
        try:
            with self._conn().cursor() as cur:
                cur.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                            (self.config.slot,))
                row = cur.fetchone()
                if row is None:
                    return None
                if row[0] is not None:
                    return int(row[0])
                cur.execute("SELECT pg_drop_replication_slot(%s)", (self.config.slot,))
        except psycopg2.errors.ObjectInUse:
            return -1  # taken between the look and the drop: look again
        except psycopg2.Error as error:
            raise typed(error, f"dropping replication slot {self.config.slot!r}") from None
        return None

    def remove(self) -> None:
        """Drop the slot and the publication (deleting the stream)."""
        self.drop_slot()
        with self._conn().cursor() as cur:
            cur.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(
                sql.Identifier(self.config.publication)))

    def close(self) -> None:
        for conn in (self._sql, self._exporter):
            if conn is not None and not conn.closed:
                conn.close()


def _python(row: dict[str, Any], item: SourceObject) -> dict[str, Any]:
    """A snapshot row (record encoding) as Python values."""
    return {c.name: decode_value(row[c.name], c.type) for c in item.columns}
