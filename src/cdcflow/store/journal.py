"""The commit journal: a native commit's row changes, written in its own transaction, and
rendered into change records before anyone reads or reshapes the log (CS-1).

A commit of the embedded database that a change stream watches writes, with its row
versions, ONE row here: its timestamp, its transaction id and its net row changes (table,
key, key hash, row before, row after, columns written). That row is the commit's change
records in their compact form: they exist if and only if the commit does. It is also the
commit's only record of its timestamp and transaction id until it is settled (the commit
does not write `_meta`: `cdcflow.store.sqlite.read_meta`). Building the
records' bodies (per stream, per partition) and appending them to `_log` is "settling" the
journal, done in a later write transaction, oldest commit first, with exactly the inputs the
commit had:
- the catalog (schemas and streams) and the partition map may change only after the journal
  is settled: DDL, splits and merges, the policy, retention and dropping a stream settle it
  first, in their own write transaction, so a journal row always renders against the catalog
  and partitions of its commit;
- readers settle it before they read records up to a time (`ChangeLog`), and the safe time a
  reader computes stops before the oldest unsettled commit (`readable_micros`), so no reader
  passes a commit whose records are not in `_log` yet.
The records are the same text, with the same tokens and sequences, as rendering them at
commit gives (tests/property/test_journal.py). The commit path writes one small row instead
of every stream's record bodies and their index entries (bench/bench_commit.py).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import orjson

from cdcflow.model.schema import ChangeStreamDef, TableSchema
from cdcflow.store import log
from cdcflow.store.capture import RowChange
from cdcflow.store.catalog import Catalog
from cdcflow.store.native_entries import native_entries
from cdcflow.store.session import Session
from cdcflow.store.sqlite import read_meta, write_meta, write_transaction

SETTLE_BACKLOG = 10_000
"""A writer's policy check settles the journal once it holds more commits than this, so a
file no reader settles keeps a bounded journal (and a settle of bounded length)."""
SETTLE_CHANGES = 2_000
"""Row changes a reader settles per write transaction (about 10 ms of rendering): writers
wait for one such batch at a time, not for a whole journal."""


def write_entry(conn: sqlite3.Connection, micros: int, transaction_id: str,
                changes: list[RowChange], after_texts: list[str | None]) -> None:
    """The journal row of a commit: its changes, each row after given as its stored text."""
    conn.execute("INSERT INTO _journal(micros, txn, size, changes) VALUES (?, ?, ?, ?)",
                 (micros, transaction_id, len(changes), _encode(changes, after_texts)))


def _encode(changes: list[RowChange], after_texts: list[str | None]) -> str:
    """orjson's text, the rows after as stored; or, should orjson refuse a value (an
    integer beyond 64 bits), the standard encoder's after a space, which tells `_decode` to
    read it with the standard decoder (orjson would read such an integer as a float)."""
    try:
        return orjson.dumps([
            [c.schema.name, c.encoded_key, c.key_hash, c.before,
             None if text is None else orjson.Fragment(text), list(c.written)]
            for c, text in zip(changes, after_texts, strict=True)]).decode()
    except orjson.JSONEncodeError:
        return " " + json.dumps([
            [c.schema.name, c.encoded_key, c.key_hash, c.before,
             None if text is None else json.loads(text), list(c.written)]
            for c, text in zip(changes, after_texts, strict=True)])


def first_pending(conn: sqlite3.Connection) -> int | None:
    """The commit micros of the oldest unsettled commit (None: the journal is settled)."""
    row = conn.execute("SELECT micros FROM _journal ORDER BY micros LIMIT 1").fetchone()
    return None if row is None else int(row[0])


def holds_more_than(conn: sqlite3.Connection, commits: int) -> bool:
    return conn.execute("SELECT 1 FROM _journal ORDER BY micros LIMIT 1 OFFSET ?",
                        (commits,)).fetchone() is not None


def pending_changes(conn: sqlite3.Connection) -> int:
    """The row changes of the oldest `SETTLE_BACKLOG` unsettled commits: at most the records
    settling them adds to any one partition (each record holds at least one change)."""
    (total,) = conn.execute("SELECT COALESCE(SUM(size), 0) FROM (SELECT size FROM _journal "
                            "ORDER BY micros LIMIT ?)", (SETTLE_BACKLOG,)).fetchone()
    return int(total)


def safe_micros(conn: sqlite3.Connection) -> int:
    """The safe time of this snapshot: every commit at or before it is readable now and none
    will come later. The last commit or published closed time, cut before the oldest
    unsettled commit."""
    meta = read_meta(conn)
    return readable_micros(conn, max(int(meta["last_commit_micros"]),
                                     int(meta["closed_micros"])))


def readable_micros(conn: sqlite3.Connection, safe: int) -> int:
    """`safe` (every commit at or before it is done), cut to just before the oldest
    unsettled commit: what a reader may read up to in this snapshot."""
    pending = first_pending(conn)
    return safe if pending is None else min(safe, pending - 1)


def read_bound(conn: sqlite3.Connection, until: int | None) -> int | None:
    """A read's bound (None: none), cut to just before the oldest unsettled commit."""
    pending = first_pending(conn)
    if pending is None:
        return until
    return pending - 1 if until is None else min(until, pending - 1)


def settle_pending(session: Session, up_to: int | None = None) -> None:
    """Before a read up to commit micros `up_to` (None: everything): settle the journal's
    commits up to there, about `SETTLE_CHANGES` changes a write transaction."""
    while True:
        pending = first_pending(session.conn)
        if pending is None or (up_to is not None and pending > up_to):
            return
        with write_transaction(session.conn):
            settle(session, session.refresh(), SETTLE_CHANGES)


def settle(session: Session, catalog: Catalog, max_changes: int | None = None) -> int:
    """Render journal rows into the log, oldest first, and remove them: all of them, or the
    oldest that hold `max_changes` changes or more (one row at least); inside the caller's
    write transaction. Return how many commits were settled."""
    conn = session.conn
    renderer = _Renderer(session, catalog)
    records: list[log.DataRow] = []
    settled = changes = 0
    last: int | None = None
    cursor = conn.execute("SELECT micros, txn, size, changes FROM _journal ORDER BY micros")
    for micros, transaction_id, size, text in cursor:
        records.extend(renderer.records(int(micros), transaction_id, text))
        settled, changes, last = settled + 1, changes + int(size), int(micros)
        if len(records) >= SETTLE_CHANGES:  # bounded memory for a settle of everything
            log.insert_data_records(conn, records)
            records = []
        if max_changes is not None and changes >= max_changes:
            break
    cursor.close()
    log.insert_data_records(conn, records)
    if last is not None:
        kept = read_meta(conn)  # the journal's newest commit, kept in meta before removal
        write_meta(conn, {key: kept[key] for key in ("last_commit_micros", "txn_counter")})
        conn.execute("DELETE FROM _journal WHERE micros <= ?", (last,))
    return settled


class _Renderer:
    """Log rows of journal rows, with each table's schema and watching streams looked up
    once."""

    def __init__(self, session: Session, catalog: Catalog) -> None:
        self.session, self.catalog = session, catalog
        self.tables: dict[str, tuple[TableSchema, list[ChangeStreamDef]]] = {}

    def records(self, micros: int, transaction_id: str, text: str) -> list[log.DataRow]:
        changes: list[RowChange] = []
        streams: dict[str, ChangeStreamDef] = {}
        for table, key, key_hash, before, after, written in _decode(text):
            schema, watching = self._table(table)
            changes.append(RowChange(schema, key, key_hash, before, after, set(written)))
            streams.update((s.name, s) for s in watching)
        entries = native_entries(changes, list(streams.values()), self.session.ranges_of,
                                 micros, transaction_id)
        return [log.DataRow(e.stream, e.token, micros, e.sequence, e.mods, e.body)
                for e in entries]

    def _table(self, name: str) -> tuple[TableSchema, list[ChangeStreamDef]]:
        found = self.tables.get(name)
        if found is None:
            found = (self.catalog.table(name), self.catalog.streams_watching(name))
            self.tables[name] = found
        return found


def _decode(text: str) -> list[list[Any]]:
    entry: list[list[Any]] = json.loads(text) if text.startswith(" ") else orjson.loads(text)
    return entry
