"""SQLite plumbing: connections in WAL mode, the internal schema, write and read transactions.

Writers serialise on SQLite's write lock (`BEGIN IMMEDIATE`); commit timestamps are assigned
inside that lock, so they increase strictly across every process sharing the file. Readers use
deferred transactions, which in WAL mode see one consistent snapshot and never block writers.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cdcflow.errors import FailedPrecondition
from cdcflow.store import log, record_types

_SCHEMA = """
CREATE TABLE IF NOT EXISTS _meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS _tables (
    name TEXT PRIMARY KEY, schema TEXT NOT NULL, storage TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS _streams (
    name TEXT PRIMARY KEY, definition TEXT NOT NULL, policy_checked_micros INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS _indexes (
    name TEXT PRIMARY KEY, definition TEXT NOT NULL, storage TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS _shard_streams (
    stream_id TEXT PRIMARY KEY, table_name TEXT NOT NULL, change_stream TEXT NOT NULL,
    enabled_micros INTEGER NOT NULL, expiration_micros INTEGER NOT NULL,
    disabled_micros INTEGER);
"""

_DEFAULT_META = {
    "last_commit_micros": 0,
    "closed_micros": 0,
    "txn_counter": 0,
    "schema_version": 0,
    "partition_version": 0,
    "storage_counter": 0,
    "token_counter": 0,
    "gc_micros": 0,
}



class LogConnection(sqlite3.Connection):
    """A connection with its caches of the file's column types (`record_types`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.type_ids: dict[str, int] = {}
        self.type_texts: dict[int, str] = {}


def connect(path: str) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), WAL journal, 60 s busy
    wait. A file this process may not open for writing is FailedPrecondition naming it."""
    try:
        conn = sqlite3.connect(path, timeout=60.0, isolation_level=None,
                               check_same_thread=False, factory=LogConnection)
        conn.execute("PRAGMA journal_mode=WAL")
    except sqlite3.OperationalError as error:
        raise _not_writable(path, error) from None
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=60000")
    return conn


_NOT_WRITABLE = ("unable to open database file", "readonly database")


def _not_writable(path: str, error: sqlite3.OperationalError) -> Exception:
    """SQLite's refusal to open or write a file, as FailedPrecondition naming the file and
    the rule; any other error as it is."""
    if not any(text in str(error) for text in _NOT_WRITABLE):
        return error
    return FailedPrecondition(
        f"cannot open {path!r} for reading and writing ({error}): cdcflow keeps its files in "
        "SQLite's WAL mode, where even a reader writes the shared-memory file beside the "
        "file, and renders committed changes into change records before it reads them; "
        "give this process write access to the file and its folder")


def _file_of(conn: sqlite3.Connection) -> str:
    return str(conn.execute("PRAGMA database_list").fetchone()[2])


def initialise(conn: sqlite3.Connection) -> None:
    """Create the internal tables and meta values if missing, and bring a file of an older
    format up to this one (idempotent, safe to race)."""
    with write_transaction(conn):
        for statement in _SCHEMA.strip().split(";"):
            if statement.strip():
                conn.execute(statement)
        log.create_tables(conn)
        conn.executemany(
            "INSERT OR IGNORE INTO _meta(key, value) VALUES (?, ?)", _DEFAULT_META.items()
        )
        meta = read_meta(conn)
        check_format(meta)
        if meta.get("record_counts") != "kept":
            log.count_records(conn)
        write_meta(conn, {"log_format": log.FORMAT_VERSION, "record_counts": "kept"})


def file_format(meta: dict[str, Any]) -> int:
    """The format a file was written in; a file without the key is format 1."""
    return int(meta.get("log_format", 1))


def check_format(meta: dict[str, Any]) -> None:
    found = file_format(meta)
    if found > log.FORMAT_VERSION:
        raise FailedPrecondition(
            f"the file has log format {found}, newer than this cdcflow reads "
            f"({log.FORMAT_VERSION}); upgrade cdcflow to open it"
        )


@contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """Hold the database write lock; commit on success, roll back on any exception. A file
    this connection may not write is FailedPrecondition naming it, and nothing is written."""
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as error:
        raise _not_writable(_file_of(conn), error) from None
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        record_types.forget_written(conn)
        raise
    conn.execute("COMMIT")


@contextmanager
def read_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One consistent snapshot for every statement inside."""
    conn.execute("BEGIN")
    try:
        yield conn
    finally:
        conn.execute("COMMIT")


def read_meta(conn: sqlite3.Connection) -> dict[str, Any]:
    """The file's meta values. A commit that writes a journal row does not write its
    timestamp and transaction id here (a page less a commit): the journal's newest row
    holds them, so the last commit and transaction id are the newer of the two (settling
    writes them back here before it removes journal rows)."""
    meta = dict(conn.execute("SELECT key, value FROM _meta").fetchall())
    check_format(meta)  # a newer cdcflow may have upgraded the file since it was opened
    if file_format(meta) >= log.JOURNALED_COMMITS:
        newest = conn.execute(
            "SELECT micros, txn FROM _journal ORDER BY micros DESC LIMIT 1").fetchone()
        if newest is not None:
            meta["last_commit_micros"] = max(int(meta["last_commit_micros"]), int(newest[0]))
            meta["txn_counter"] = max(int(meta["txn_counter"]), int(newest[1]))
    return meta


def write_meta(conn: sqlite3.Connection, values: dict[str, Any]) -> None:
    pairs = [(k, v) for k, v in values.items()]
    conn.executemany(
        "INSERT INTO _meta(key, value) VALUES (?, ?) "
        "ON CONFLICT(key) DO UPDATE SET value = excluded.value", pairs
    )


def storage_name(number: int) -> str:
    """The SQLite table holding the row versions of one user table."""
    return f"_rows_{number}"


def create_row_storage(conn: sqlite3.Connection, storage: str) -> None:
    """Row versions: one row per (key, commit) with a tombstone flag; read the latest <= T.

    No index on `key_hash`: it doubled the cost of a commit (a random index page per row
    written), and only snapshot slices read by hash range, scanning in key order anyway.
    Files made before keep theirs; no statement depends on it."""
    conn.execute(
        f"CREATE TABLE {storage} (key TEXT NOT NULL, commit_micros INTEGER NOT NULL, "
        "key_hash INTEGER NOT NULL, deleted INTEGER NOT NULL, row TEXT, "
        "PRIMARY KEY (key, commit_micros)) WITHOUT ROWID"
    )
