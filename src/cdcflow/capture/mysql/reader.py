"""The binlog read in a process of its own: mysql-replication's decoding beside the capture's
conversion and appends, on another core.

Decoding a row event in the library costs about as much CPU as the capture's own share
(conversion, validation, the log's append), so one process caps the capture at the sum of
the two. The reader process runs `BinLogStreamReader` and sends what the capture needs, in
order, as plain tuples (`Event`), many to a message:

    ("gtid", gtid, standalone, timestamp, log_file, log_position)
    ("table", key, table, columns, primary_key)  a table map seen for the first time
    ("rows", key, kind, rows, log_file, log_position)
    ("xid", timestamp, log_file, log_position)
    ("query", text, schema, timestamp, log_file, log_position)
    ("heartbeat", log_file, log_position)
    ("failed", error)                            the reader's last message

Rows of tables the capture does not select are dropped in the reader, undecoded. The reader
keeps the GTID state of the groups it has read, so that the library's own reconnects resume
after the last one; the capture keeps its own state for what it stores. The reader dies with
the thread that started it (PR_SET_PDEATHSIG), so a killed capture never leaves a second
replica with its server id behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import select
import signal
import site
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from cdcflow.capture.mysql.connection import Endpoint
from cdcflow.capture.mysql.position import GtidState, MySqlGtidSet, after_group
from cdcflow.capture.mysql.rows import binlog_column
from cdcflow.errors import Unavailable
from cdcflow.model.memo import IdentityMemo

Event = tuple[Any, ...]
STANDALONE = 1  # MariaDB GTID flag: a group without XID/COMMIT (DDL)
EVENTS_PER_MESSAGE = 500
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, slots=True)
class ReadFrom:
    """Where and what the reader reads; picklable."""

    endpoint: Endpoint
    server_id: int
    databases: tuple[str, ...]
    selected: Callable[[str], bool]
    mariadb: bool
    gtid: str
    log_file: str
    log_position: int
    heartbeat_seconds: float


class BinlogReader:
    """The capture's side: start the reader process, take its events, stop it. The reader is
    a plain child process (`python -m cdcflow.capture.mysql.reader`), not a multiprocessing
    one: the capture worker it serves may itself be a daemonic multiprocessing process."""

    def __init__(self, read_from: ReadFrom) -> None:
        mine, theirs = socket.socketpair()
        with theirs:  # -P: nothing of the working directory on the reader's import path
            self.process = subprocess.Popen(
                [sys.executable, "-P", "-m", "cdcflow.capture.mysql.reader",
                 str(theirs.fileno()), str(os.getpid())], pass_fds=(theirs.fileno(),),
                env=_environment(), stdin=subprocess.DEVNULL)
        self.inbox = Connection(mine.detach())
        try:
            self.inbox.send(read_from)
        except BaseException:
            self.close()
            raise

    def take(self, seconds: float) -> list[Event]:
        """The next message's events; [] when none came within `seconds`."""
        try:
            if not self.inbox.poll(seconds):
                return []
            events: list[Event] = self.inbox.recv()
        except (EOFError, OSError):
            raise Unavailable(f"the binlog reader process ended (exit code "
                              f"{self.process.poll()})") from None
        if events and events[-1][0] == "failed":
            raise events[-1][1]
        return events

    def waiting(self) -> bool:
        """A message is there to take at once."""
        try:
            return bool(self.inbox.poll(0))
        except (EOFError, OSError):
            return False

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        self.inbox.close()


def _environment() -> dict[str, str]:
    """The capture's environment, with the folder of this cdcflow first on PYTHONPATH when
    it is not a site-packages folder the interpreter reads anyway (a source checkout), so
    that the reader runs the same cdcflow."""
    package_root = Path(__file__).resolve().parents[3]
    installed = {Path(p).resolve() for p in site.getsitepackages()}
    if package_root in installed:
        return dict(os.environ)
    path = os.environ.get("PYTHONPATH")
    return os.environ | {"PYTHONPATH": str(package_root) + (os.pathsep + path if path else "")}


def read_binlog(outbox: Connection, parent: int) -> None:
    """The reader process: stream the binlog into `outbox` until the capture goes."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        return  # the capture went before the reader could follow it
    for handled_by_the_capture in (signal.SIGINT, signal.SIGTERM):  # it stops the reader
        signal.signal(handled_by_the_capture, signal.SIG_IGN)
    try:
        _Reading(outbox.recv(), outbox).run()
    except (BrokenPipeError, ConnectionResetError, EOFError):
        return  # the capture went
    except Exception as error:  # said to the capture, which raises it
        with contextlib.suppress(Exception):
            outbox.send([("failed", _picklable(error))])


def _picklable(error: Exception) -> Exception:
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # an error that does not travel is said as text
        return Unavailable(f"reading the binlog failed: {type(error).__name__}: {error}")
    return error


class _Reading:
    def __init__(self, read_from: ReadFrom, outbox: Connection) -> None:
        self.read_from, self.outbox = read_from, outbox
        self.gtid: GtidState | MySqlGtidSet = GtidState.parse(read_from.gtid) \
            if read_from.mariadb else MySqlGtidSet.parse(read_from.gtid)
        self.pending: list[Event] = []
        self.group: tuple[str, bool] | None = None  # the GTID being read, and standalone
        self.tables: set[tuple[int, tuple[str, ...]]] = set()
        self.selected_tables: dict[tuple[str, str], bool] = {}
        """Per (database, table) of a rows event: whether the capture selects it."""
        self.column_names: IdentityMemo[list[Any], tuple[str, ...]] = IdentityMemo(
            lambda columns: tuple(str(c.name) for c in columns), size=4096)
        """Per table map's column list: its column names."""
        self.stream = _open(read_from)

    def run(self) -> None:
        """Send what was read once a group, a statement or a heartbeat ends and the server
        has nothing more to send at once (or the message is full): the capture acts on whole
        groups only, so asking the socket after every row event would be wasted."""
        while True:
            event = self.stream.fetchone()
            if event is not None and not self._handle(event):
                continue  # inside a group: the rest of it is on its way
            if self.pending and (len(self.pending) >= EVENTS_PER_MESSAGE
                                 or not _more_waiting(self.stream)):
                self.outbox.send(self.pending)
                self.pending = []

    def _handle(self, event: Any) -> bool:
        """Take one event; return whether what was read may be sent now: False after an
        event that leaves its group open, unless the message is full."""
        name = type(event).__name__
        if name in ("WriteRowsEvent", "UpdateRowsEvent", "DeleteRowsEvent"):
            self._rows(event, name)
            return len(self.pending) >= EVENTS_PER_MESSAGE
        where = (self.stream.log_file, int(self.stream.log_pos or 0))
        if name in ("MariadbGtidEvent", "GtidEvent"):
            standalone = name == "MariadbGtidEvent" and bool(getattr(event, "flags", 0)
                                                             & STANDALONE)
            self.pending.append(("gtid", str(event.gtid), standalone, int(event.timestamp),
                                 *where))
            self.group = (str(event.gtid), standalone)
            return len(self.pending) >= EVENTS_PER_MESSAGE
        if name == "XidEvent":
            self.pending.append(("xid", int(event.timestamp), *where))
            self._group_ended(True)
        elif name == "QueryEvent":
            text = event.query.decode() if isinstance(event.query, bytes) else str(event.query)
            schema = event.schema.decode() if isinstance(event.schema, bytes) \
                else str(event.schema or "")
            self.pending.append(("query", text, schema, int(event.timestamp), *where))
            word = first_word(text)
            if word == "ROLLBACK" or word == "COMMIT" or (self.group and self.group[1]):
                self._group_ended(word != "ROLLBACK")
            elif word == "BEGIN":  # MySQL opens a row-based group so: its rows follow
                return len(self.pending) >= EVENTS_PER_MESSAGE
        elif name == "HeartbeatLogEvent":
            self.pending.append(("heartbeat", *where))
        return True

    def _group_ended(self, committed: bool) -> None:
        """After a group, a reconnect inside the library resumes from the next one; an
        unfinished group is sent again whole."""
        if self.group is not None and committed:
            self.gtid = after_group(self.gtid, self.group[0])
            if self.read_from.mariadb:
                self.stream.auto_position = self.gtid.text()
        self.group = None

    def _rows(self, event: Any, kind: str) -> None:
        chosen = self.selected_tables.get((event.schema, event.table))
        if chosen is None:
            chosen = self.selected_tables[(event.schema, event.table)] = (
                event.schema in self.read_from.databases
                and self.read_from.selected(f"{event.schema}.{event.table}"))
        if not chosen:
            return
        key = (int(event.table_id), self.column_names(event.columns))
        if key not in self.tables:
            columns = [binlog_column(c) for c in event.columns]
            self.pending.append(("table", key, f"{event.schema}.{event.table}", columns,
                                 event.primary_key))
            self.tables.add(key)
        self.pending.append(("rows", key, kind, event.rows, self.stream.log_file,
                             int(event.packet.log_pos)))


def first_word(text: str) -> str:
    """A statement's first word in upper case ('' for none)."""
    words = text.strip().split(None, 1)
    return words[0].upper() if words else ""


def _open(read_from: ReadFrom) -> Any:
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.event import (
        GtidEvent,
        HeartbeatLogEvent,
        MariadbGtidEvent,
        QueryEvent,
        RotateEvent,
        XidEvent,
    )
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    options: dict[str, Any] = {
        "connection_settings": read_from.endpoint.settings(),
        "server_id": read_from.server_id, "blocking": True,
        "slave_heartbeat": read_from.heartbeat_seconds,
        "only_events": [MariadbGtidEvent, GtidEvent, QueryEvent, RotateEvent, XidEvent,
                        WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, HeartbeatLogEvent],
        "enable_logging": False,
        # A table map is parsed once per table id: the server gives a table a new id
        # whenever its definition changes (ALTER, or its share reopened), and ids are
        # not reused while it runs (a restart rotates the binlog, which clears them).
        "freeze_schema": True,
    }
    if read_from.mariadb:
        options |= {"is_mariadb": True, "auto_position": read_from.gtid}
    else:
        options |= {"resume_stream": True, "log_file": read_from.log_file,
                    "log_pos": read_from.log_position}
    return BinLogStreamReader(**options)


def _more_waiting(stream: Any) -> bool:
    """The binlog connection's socket has bytes to read (a read would not wait)."""
    sock = getattr(getattr(stream, "_stream_connection", None), "_sock", None)
    if sock is None:
        return False
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


if __name__ == "__main__":
    read_binlog(Connection(int(sys.argv[1])), int(sys.argv[2]))
