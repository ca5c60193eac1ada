"""WAL checkpoints on a thread of their own, for a connection that appends all the time.

SQLite copies its write-ahead log into the database file (a checkpoint) inside the COMMIT
that makes the log pass `wal_autocheckpoint` pages. A capture worker appending megabytes a
second would pay for that copy, and its fsyncs, on its own thread, between two batches. While
`BackgroundCheckpoints` runs, that connection does not checkpoint: a thread with a connection
of its own runs passive checkpoints, which never block a writer or a reader, and spends its
time inside SQLite, outside the interpreter's lock. Nothing about durability changes: a
commit is in the WAL, and the WAL is the database, whichever thread copies it later.
"""

from __future__ import annotations

import sqlite3
import threading
from types import TracebackType

from cdcflow.store.sqlite import connect

DEFAULT_AUTOCHECKPOINT_PAGES = 1000
"""SQLite's own default, restored when the thread stops."""


class BackgroundCheckpoints:
    """A context manager: passive checkpoints of `path` every `seconds` while inside."""

    def __init__(self, path: str, writer: sqlite3.Connection, seconds: float = 0.25) -> None:
        self.path, self.writer, self.seconds = path, writer, seconds
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="cdcflow-checkpoints",
                                       daemon=True)
        self.checkpoints = 0

    def __enter__(self) -> BackgroundCheckpoints:
        self.writer.execute("PRAGMA wal_autocheckpoint=0")
        self.thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.done.set()
        self.thread.join()
        self.writer.execute(f"PRAGMA wal_autocheckpoint={DEFAULT_AUTOCHECKPOINT_PAGES}")

    def _run(self) -> None:
        conn = connect(self.path)
        try:
            while not self.done.wait(self.seconds):
                self.checkpoint(conn)
            self.checkpoint(conn)
        finally:
            conn.close()

    def checkpoint(self, conn: sqlite3.Connection) -> None:
        """One passive checkpoint; a busy database is tried again next time."""
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.OperationalError:
            return
        self.checkpoints += 1
