"""MySQL and MariaDB as a `ChangeSource`: a consistent snapshot for the backfill, and a capture
worker that reads the row-based binlog from the snapshot's position into the change log.

The snapshot is a transaction started WITH CONSISTENT SNAPSHOT. MariaDB reports the binlog
position that transaction sees (`binlog_snapshot_file`/`_position`, without a lock) and its
GTID state (`BINLOG_GTID_POS`); MySQL takes it under a brief FLUSH TABLES WITH READ LOCK. The
capture starts exactly there, so backfill and changes meet with no gap and no duplicate. A
backfill cut short goes on in a newer snapshot; the capture still starts at the first one,
and whole-row changes applied over rows read later give the same rows (EV-7).

Before anything is read, the server's binlog settings and the user's privileges are checked
(`checks.check_server`), and a stored position whose binlog file has been purged is refused
with PositionLost rather than read from wherever the server would start.
"""

from __future__ import annotations

import fnmatch
import threading
from dataclasses import dataclass
from typing import Any

from cdcflow.capture.mysql.catalog import MySqlTable, read_tables
from cdcflow.capture.mysql.checks import check_server
from cdcflow.capture.mysql.connection import Endpoint, connect, query
from cdcflow.capture.mysql.position import MySqlGtidSet
from cdcflow.capture.mysql.rebackfill import file_order
from cdcflow.capture.mysql.snapshot import open_consistent, read_chunk
from cdcflow.capture.mysql.stream import BinlogCapture, Settings
from cdcflow.capture.source import RowSink, Snapshot, SourceObject, WorkerHooks
from cdcflow.clock import SYSTEM_CLOCK, Clock
from cdcflow.errors import FailedPrecondition, InvalidArgument, PositionLost
from cdcflow.model.source import MYSQL
from cdcflow.model.timestamps import from_micros, to_micros
from cdcflow.store.changelog import ChangeLog

CHANGE_STREAM = "changes"


@dataclass(frozen=True, slots=True)
class MySqlConfig:
    """A MySQL/MariaDB source of one stream (see `streams.definition.MySqlSource`)."""

    endpoint: Endpoint
    databases: tuple[str, ...]
    server_id: int
    log_path: str
    include: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ()
    chunk_rows: int = 5_000
    heartbeat_seconds: float = 1.0
    on_position_lost: str = "fail"
    """"fail": the capture stops with PositionLost; "backfill": it starts over from the
    server's position now and every table is backfilled again."""

    def selects(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in self.include) and not any(
            fnmatch.fnmatchcase(name, p) for p in self.exclude)


class MySqlSource:
    kind = MYSQL
    has_worker = True

    def __init__(self, config: MySqlConfig, clock: Clock = SYSTEM_CLOCK,
                 hooks: WorkerHooks | None = None) -> None:
        self.config = config
        self.clock = clock
        self.hooks = hooks or WorkerHooks()
        self.source_id = f"mysql:{config.endpoint.host}:{config.endpoint.port}:" \
                         f"{config.server_id}"
        self._sql: Any = None
        self._snapshot: Any = None  # the connection holding the snapshot's transaction
        self._variables: dict[str, str] | None = None
        self._lock = threading.RLock()

    def _conn(self) -> Any:
        """The source's own connection: use it under `_lock` (a runner's threads share a
        source, and a pymysql connection is not safe to share between threads)."""
        if self._sql is None or not self._sql.open:
            self._sql = connect(self.config.endpoint)
        return self._sql

    def _query(self, statement: str, doing: str) -> list[Any]:
        with self._lock:
            return query(self._conn(), statement, (), doing)

    def check(self) -> dict[str, str]:
        """The server's variables, once its settings and the user's privileges are checked."""
        if self._variables is None:
            with self._lock:
                self._variables = check_server(self._conn(), self.config.endpoint.describe())
        return self._variables

    @property
    def mariadb(self) -> bool:
        return "mariadb" in self.check().get("version", "").lower()

    def _tables(self) -> list[MySqlTable]:
        with self._lock:
            return read_tables(self._conn(), self.config.databases)

    def discover(self) -> list[SourceObject]:
        return [t.source_object() for t in self._tables()]

    def log_location(self) -> tuple[str, str]:
        return self.config.log_path, CHANGE_STREAM

    # ---- the snapshot and the backfill ----------------------------------------------------

    def snapshot(self, objects: list[SourceObject], resume: dict[str, Any] | None) -> Snapshot:
        self.check()
        log = ChangeLog.open(self.config.log_path)
        log.ensure_change_stream(CHANGE_STREAM)
        if not objects:
            raise InvalidArgument("the stream selects no table of the source; check "
                                  "databases, include and exclude")
        position = self._open_snapshot()
        if resume is not None:
            return Snapshot(self.clock.now(), resume, from_micros(int(resume["cdc_start"])))
        cdc_start = log.current_timestamp()
        log.forget_position(self.source_id)
        log.advance(self.source_id, None, position)
        start = to_micros(cdc_start) + 1
        return Snapshot(self.clock.now(), position | {"cdc_start": start}, from_micros(start))

    def _open_snapshot(self) -> dict[str, Any]:
        """Start the snapshot's transaction; return the binlog position it corresponds to."""
        self.release(None)
        self._snapshot, position = open_consistent(self.config.endpoint, self.mariadb)
        return position

    def backfill(self, snapshot: Snapshot, objects: list[SourceObject], sink: RowSink,
                 resume: dict[str, Any] | None = None) -> None:
        if self._snapshot is None:
            self._open_snapshot()
        tables = {t.object_name: t for t in self._tables()}
        for item in objects:
            after = (resume or {}).get(item.name)
            while after != "done":
                rows, after, full = read_chunk(self._snapshot, tables[item.name], item, after,
                                               self.config.chunk_rows)
                if rows:
                    sink(item, rows, after)
                after = after if full else "done"

    def release(self, snapshot: Snapshot | None) -> None:
        if self._snapshot is not None:
            if self._snapshot.open:
                self._snapshot.rollback()
                self._snapshot.close()
            self._snapshot = None

    # ---- capture --------------------------------------------------------------------------

    def capture(self, log: ChangeLog, stop: threading.Event) -> None:
        mariadb = self.mariadb
        try:
            self.ensure_readable(log)
        except PositionLost as lost:
            if self.config.on_position_lost != "backfill":
                raise
            self._start_over(log, str(lost))
        settings = Settings(self.source_id, self.config.endpoint, self.config.server_id,
                            self.config.databases, self.config.selects, mariadb,
                            self.config.heartbeat_seconds, self.config.chunk_rows, self.hooks)
        with log.checkpoints_in_background():
            BinlogCapture(settings, log).run(stop)

    def binary_logs(self) -> list[str]:
        return [str(row[0]) for row in self._query("SHOW BINARY LOGS",
                                                   "listing the binary logs")]

    def ensure_readable(self, log: ChangeLog) -> None:
        """PositionLost if the binlog file of the stored position is no longer on the server
        (purged), or, on MySQL with GTIDs, if `gtid_purged` holds transactions the stored
        GTID set lacks: reading on would skip every change they held."""
        stored = log.position(self.source_id)
        if stored is None:
            raise FailedPrecondition(f"no binlog position is stored for {self.source_id}; "
                                     "a backfill sets it")
        where = stored.position
        gone = where["log_file"] not in self.binary_logs()
        if not gone and not self.mariadb and where.get("gtid"):
            ((purged,),) = self._query("SELECT @@GLOBAL.gtid_purged", "reading gtid_purged")
            gone = not MySqlGtidSet.parse(str(where["gtid"])).contains(
                MySqlGtidSet.parse(str(purged or "")))
        if gone:
            raise PositionLost(
                f"binlog position {where['log_file']}:{where['log_position']} (GTID "
                f"{where.get('gtid') or '-'}) is no longer on the server: its binary log was "
                "purged, so the changes after it are lost. Set on_position_lost: backfill in "
                "the stream's source to go on from now and backfill every table again, or "
                "delete the stream and create it again")

    def _start_over(self, log: ChangeLog, why: str) -> None:
        """on_position_lost: backfill. First the stream hears which tables to backfill again
        (so a kill after it only repeats this), then the position jumps to the server's
        position now: capture goes on from there while those tables are read again and
        the rows the source lost meanwhile are swept from their tables."""
        objects = [o for o in self.discover() if self.config.selects(o.name)]
        for item in objects:
            if not item.primary_key:
                self.hooks.report(item.name, f"{item.name} has no primary key: the changes "
                                  "lost with the binlog position are not recovered for it")
        self.hooks.position_lost(why, sorted(o.name for o in objects if o.primary_key))
        conn, now = open_consistent(self.config.endpoint, self.mariadb)
        conn.rollback()
        conn.close()
        stored = log.position(self.source_id)
        log.advance(self.source_id, None if stored is None else stored.position, now)

    def mark(self) -> dict[str, Any]:
        """The server's binlog position now (see `reached`)."""
        row = self._query("SHOW MASTER STATUS", "reading the binlog position")[0]
        return {"log_file": str(row[0]), "log_position": int(row[1])}

    def reached(self, log: ChangeLog, mark: dict[str, Any]) -> bool:
        stored = log.position(self.source_id)
        return stored is not None and file_order(
            stored.position["log_file"], stored.position["log_position"]) >= file_order(
            mark["log_file"], mark["log_position"])

    def status(self) -> dict[str, Any]:
        logs = self._query("SHOW BINARY LOGS", "listing the binary logs")
        return {"binary_logs": len(logs), "binlog_bytes": sum(int(r[1]) for r in logs),
                "warn_above": 1 << 62}

    def remove(self) -> None:
        """A binlog reader keeps nothing on the server."""

    def close(self) -> None:
        self.release(None)
        if self._sql is not None and self._sql.open:
            self._sql.close()
