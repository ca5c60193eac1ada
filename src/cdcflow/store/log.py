"""The log tables and every SQL statement on them (the DAO of the change log).

Six tables make the log: `_partitions` (each change-stream partition: key range, time span,
lineage), `_log` (records per partition: data records, and the child-partitions record that
ends a partition), `_column_types` (the column types data records share, stored once),
`_positions` (per external source, the position after the last transaction appended),
`_objects` (the tables external sources appended, with their column types) and `_journal`
(native commits whose records are not rendered yet). No other module touches them, but
`cdcflow.store.journal` (`_journal`) and `cdcflow.store.record_types` (`_column_types`).
Every function runs inside the caller's SQLite transaction: a write function inside a write
transaction, so the records of one commit, its partition changes and the source position
land together or not at all.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any, Final, NamedTuple

from cdcflow.store import record_types

LOG_DATA: Final = 0
LOG_CHILD: Final = 1
FORMAT_VERSION: Final = 5
"""1: the first release; 2: source blocks on records, `_positions`, `_objects` (the tables
appended sources wrote, with their column types) and `_partitions.expired_upto` (the newest
commit that retention removed from a partition); 3: `_journal`, native commits' changes not
yet rendered into records (`cdcflow.store.journal`: a reader of format 2 would miss them);
4: data records' column types in `_column_types`, named by `_log.types`
(`cdcflow.store.record_types`: a reader of format 3 would read bodies without them);
5: a commit that writes a journal row leaves `_meta` as it was: the file's last commit and
transaction id are the newer of `_meta`'s and the journal's newest row's
(`cdcflow.store.sqlite.read_meta`: a reader of format 4 would allocate them again)."""
JOURNALED_COMMITS: Final = 5
"""The first format whose journal rows may be the only record of the last commit."""

_TABLES = (
    "CREATE TABLE IF NOT EXISTS _partitions ("
    "stream TEXT NOT NULL, token TEXT NOT NULL, range_start INTEGER NOT NULL, "
    "range_end INTEGER NOT NULL, start_micros INTEGER NOT NULL, end_micros INTEGER, "
    "parents TEXT NOT NULL, children TEXT NOT NULL, records INTEGER NOT NULL, "
    "expired_upto INTEGER, PRIMARY KEY (stream, token))",
    "CREATE TABLE IF NOT EXISTS _log ("
    "stream TEXT NOT NULL, token TEXT NOT NULL, commit_micros INTEGER NOT NULL, "
    "seq INTEGER NOT NULL, kind INTEGER NOT NULL, mods INTEGER NOT NULL, body TEXT NOT NULL, "
    "types INTEGER, PRIMARY KEY (stream, token, commit_micros, seq))",
    record_types.TABLE,
    "CREATE TABLE IF NOT EXISTS _positions ("
    "source TEXT PRIMARY KEY, position TEXT NOT NULL, source_micros INTEGER, "
    "appended_micros INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS _objects ("
    "name TEXT PRIMARY KEY, column_types TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS _journal ("
    "micros INTEGER PRIMARY KEY, txn TEXT NOT NULL, size INTEGER NOT NULL, "
    "changes TEXT NOT NULL)",
)
_PARTITION_COLUMNS = (
    "token, range_start, range_end, start_micros, end_micros, parents, children, records"
)
_AFTER_EVERYTHING = 1 << 62
"""A record sequence above every real one: (micros, this) sorts after all records at micros."""

PartitionRow = tuple[str, int, int, int, int | None, str, str, int]
LogRow = tuple[int, int, int, str]
"""(commit micros, seq, kind, JSON body)"""


def create_tables(conn: sqlite3.Connection) -> None:
    """Create the log tables if missing (idempotent; also upgrades a file of an older
    format)."""
    for statement in _TABLES:
        conn.execute(statement)
    columns = {row[1] for row in conn.execute("PRAGMA table_info(_partitions)")}
    if "expired_upto" not in columns:
        conn.execute("ALTER TABLE _partitions ADD COLUMN expired_upto INTEGER")
    if "types" not in {row[1] for row in conn.execute("PRAGMA table_info(_log)")}:
        conn.execute("ALTER TABLE _log ADD COLUMN types INTEGER")  # NULL: a whole body


# ---- partitions -----------------------------------------------------------------------------


def insert_partition(
    conn: sqlite3.Connection, stream: str, token: str, key_range: tuple[int, int], start: int,
    parents: list[str],
) -> None:
    conn.execute(
        f"INSERT INTO _partitions(stream, {_PARTITION_COLUMNS}) "
        "VALUES (?, ?, ?, ?, ?, NULL, ?, '[]', 0)",
        (stream, token, key_range[0], key_range[1], start, json.dumps(parents)),
    )


def finish_partition(
    conn: sqlite3.Connection, stream: str, token: str, at: int, children: list[str]
) -> None:
    conn.execute(
        "UPDATE _partitions SET end_micros = ?, children = ? WHERE stream = ? AND token = ?",
        (at, json.dumps(children), stream, token),
    )


def partition_parents(conn: sqlite3.Connection, stream: str, token: str) -> list[str]:
    (parents,) = conn.execute(
        "SELECT parents FROM _partitions WHERE stream = ? AND token = ?", (stream, token)
    ).fetchone()
    result: list[str] = json.loads(parents)
    return result


def all_partitions(conn: sqlite3.Connection, stream: str,
                   ending_after: int | None = None) -> list[PartitionRow]:
    """Every partition of `stream`; with `ending_after`, only those still active or ending
    later than that (the ones a read from there on can meet)."""
    if ending_after is None:
        return conn.execute(
            f"SELECT {_PARTITION_COLUMNS} FROM _partitions WHERE stream = ? "
            "ORDER BY start_micros, range_start",
            (stream,),
        ).fetchall()
    return conn.execute(
        f"SELECT {_PARTITION_COLUMNS} FROM _partitions WHERE stream = ? "
        "AND (end_micros IS NULL OR end_micros > ?) ORDER BY start_micros, range_start",
        (stream, ending_after),
    ).fetchall()


def active_partitions(conn: sqlite3.Connection, stream: str) -> list[PartitionRow]:
    return conn.execute(
        f"SELECT {_PARTITION_COLUMNS} FROM _partitions WHERE stream = ? AND end_micros IS NULL "
        "ORDER BY range_start",
        (stream,),
    ).fetchall()


def partition(conn: sqlite3.Connection, stream: str, token: str) -> PartitionRow | None:
    row: PartitionRow | None = conn.execute(
        f"SELECT {_PARTITION_COLUMNS} FROM _partitions WHERE stream = ? AND token = ?",
        (stream, token),
    ).fetchone()
    return row


def count_records(conn: sqlite3.Connection) -> None:
    """Count every partition's records once: a file whose counts this cdcflow does not keep
    yet (written before it kept them). From then on every insert and every expiry keeps
    `_partitions.records` equal to the partition's rows in `_log` (data records, and the
    child-partitions record of an ended one), in the same write transaction, so the
    partition policy reads the counts instead of counting: a count per check grew with the
    log (it read every record of every active partition, each second, once a stream had
    `max_partitions` partitions and so never split again)."""
    conn.execute(
        "UPDATE _partitions SET records = (SELECT COUNT(*) FROM _log AS l WHERE "
        "l.stream = _partitions.stream AND l.token = _partitions.token)")


def _add_records(conn: sqlite3.Connection, counts: dict[tuple[str, str], int]) -> None:
    """Records written (or, negative, removed) per (stream, token)."""
    conn.executemany(
        "UPDATE _partitions SET records = records + ? WHERE stream = ? AND token = ?",
        [(count, stream, token) for (stream, token), count in counts.items()])


# ---- records --------------------------------------------------------------------------------


class DataRow(NamedTuple):
    """One data record ready for `_log`: stream, partition token, commit micros, sequence,
    mods, body, and the body's column types when they are apart from it (None: the body is
    whole). A tuple, as the rows of a bulk insert are."""

    stream: str
    token: str
    micros: int
    sequence: int
    mods: int
    body: str
    types: str | None = None


def insert_data_records(conn: sqlite3.Connection, rows: Iterable[DataRow]) -> None:
    """Insert data records (streamed), their column types once (`record_types`), and add
    them to their partitions' counts."""
    counts: dict[tuple[str, str], int] = {}
    ids = record_types.TypeIds(conn)

    def counted() -> Iterator[tuple[Any, ...]]:
        for stream, token, micros, sequence, mods, body, types in rows:
            key = (stream, token)
            counts[key] = counts.get(key, 0) + 1
            yield stream, token, micros, sequence, LOG_DATA, mods, *ids.stored(body, types)

    conn.executemany(
        "INSERT INTO _log(stream, token, commit_micros, seq, kind, mods, body, types) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", counted())
    _add_records(conn, counts)


def insert_child_record(
    conn: sqlite3.Connection, stream: str, parent: str, at: int, body: str
) -> None:
    """The child-partitions record that ends `parent` at `at` (CS-9)."""
    conn.execute(
        "INSERT INTO _log(stream, token, commit_micros, seq, kind, mods, body) "
        "VALUES (?, ?, ?, 0, ?, 0, ?)",
        (stream, parent, at, LOG_CHILD, body),
    )
    _add_records(conn, {(stream, parent): 1})


def records_after(
    conn: sqlite3.Connection, stream: str, token: str, after: tuple[int, int], until: int | None,
    limit: int,
) -> list[LogRow]:
    """Records of a partition after position (micros, seq), up to commit micros `until`
    (None: no bound), in (commit_timestamp, record_sequence) order."""
    return record_types.read_bodies(conn, _rows_after(conn, stream, token, after, until, limit))


def record_parts_after(
    conn: sqlite3.Connection, stream: str, token: str, after: tuple[int, int], until: int | None,
    limit: int,
) -> list[tuple[int, int, int, str, str | None]]:
    """`records_after` with each body as `_log` keeps it and the text of its column types
    apart (`record_types.read_parts`): a reader that wants the column types as text need
    not parse them."""
    return record_types.read_parts(conn, _rows_after(conn, stream, token, after, until, limit))


def _rows_after(
    conn: sqlite3.Connection, stream: str, token: str, after: tuple[int, int], until: int | None,
    limit: int,
) -> list[tuple[int, int, int, str, int | None]]:
    bound = _AFTER_EVERYTHING if until is None else until
    rows: list[tuple[int, int, int, str, int | None]] = conn.execute(
        "SELECT commit_micros, seq, kind, body, types FROM _log WHERE stream = ? AND token = ? "
        "AND (commit_micros, seq) > (?, ?) AND commit_micros <= ? "
        "ORDER BY commit_micros, seq LIMIT ?",
        (stream, token, after[0], after[1], bound, limit),
    ).fetchall()
    return rows


def after_micros(micros: int) -> tuple[int, int]:
    """The position just after every record at `micros`."""
    return (micros, _AFTER_EVERYTHING)


def child_bodies(conn: sqlite3.Connection, stream: str, token: str) -> list[str]:
    return [body for (body,) in conn.execute(
        "SELECT body FROM _log WHERE stream = ? AND token = ? AND kind = ?",
        (stream, token, LOG_CHILD),
    )]


def mod_counts(
    conn: sqlite3.Connection, stream: str, token: str, after: int, until: int, limit: int
) -> list[tuple[int, int]]:
    """(commit micros, mods) of the first `limit` data records in (after, until]."""
    rows = conn.execute(
        "SELECT commit_micros, mods FROM _log WHERE stream = ? AND token = ? "
        "AND kind = ? AND commit_micros > ? AND commit_micros <= ? "
        "ORDER BY commit_micros, seq LIMIT ?",
        (stream, token, LOG_DATA, after, until, limit),
    ).fetchall()
    return [(int(m), int(n)) for m, n in rows]


def mod_total(conn: sqlite3.Connection, stream: str, token: str, after: int,
              until: int) -> int:
    """The mods of a partition's data records in (after, until]."""
    (total,) = conn.execute(
        "SELECT COALESCE(SUM(mods), 0) FROM _log WHERE stream = ? AND token = ? AND kind = ? "
        "AND commit_micros > ? AND commit_micros <= ?",
        (stream, token, LOG_DATA, after, until)).fetchone()
    return int(total)


def admission_counts(
    conn: sqlite3.Connection, stream: str, tokens: list[str], after: int, until: int,
    max_mods: int,
) -> tuple[int, list[tuple[int, int]]]:
    """What admission control needs to end a batch after `after` at about `max_mods` mods:
    a bound <= `until` by which the partitions hold more than `max_mods` mods (or `until`),
    and the (commit micros, mods) per partition and commit in (after, bound].

    Every data record holds a mod, and a partition has at most one other record (the
    child-partitions record that ends it). So more than `max_mods` data records lie at or
    before a partition's (max_mods + 2)-th record, and before the latest of every partition's
    (ceil((max_mods + 1) / n) + 1)-th. Finding those reads only the primary-key index; the
    counts then read about `max_mods` records, not `max_mods + 1` of every partition."""
    share = -(-(max_mods + 1) // max(len(tokens), 1)) + 1
    latest_share = after
    bound = until
    for token in tokens:
        own = _nth_record_micros(conn, stream, token, after, bound, max_mods + 2)
        bound = bound if own is None else own
        at_share = _nth_record_micros(conn, stream, token, after, until, share)
        latest_share = until if at_share is None else max(latest_share, at_share)
    bound = min(bound, latest_share) if tokens else bound
    counts: list[tuple[int, int]] = []
    for token in tokens:
        counts.extend(conn.execute(
            "SELECT commit_micros, SUM(mods) FROM _log WHERE stream = ? AND token = ? "
            "AND kind = ? AND commit_micros > ? AND commit_micros <= ? "
            "GROUP BY commit_micros", (stream, token, LOG_DATA, after, bound)).fetchall())
    return bound, counts


def _nth_record_micros(conn: sqlite3.Connection, stream: str, token: str, after: int,
                       until: int, nth: int) -> int | None:
    """The commit micros of a partition's `nth` record in (after, until], of any kind."""
    row = conn.execute(
        "SELECT commit_micros FROM _log WHERE stream = ? AND token = ? "
        "AND commit_micros > ? AND commit_micros <= ? ORDER BY commit_micros, seq "
        "LIMIT 1 OFFSET ?", (stream, token, after, until, nth - 1)).fetchone()
    return None if row is None else int(row[0])


def expire_records(conn: sqlite3.Connection, stream: str, cutoff: int) -> int:
    """Delete the stream's records older than `cutoff`; return how many went. Each partition
    remembers the newest commit it lost (`expired_upto`), so a reader positioned before it
    knows records it never read are gone."""
    tokens = [t for (t,) in conn.execute(
        "SELECT token FROM _partitions WHERE stream = ? AND start_micros < ?", (stream, cutoff)
    )]
    removed = 0
    for token in tokens:
        (newest,) = conn.execute(
            "SELECT MAX(commit_micros) FROM _log WHERE stream = ? AND token = ? "
            "AND commit_micros < ?", (stream, token, cutoff)).fetchone()
        if newest is None:
            continue
        gone = conn.execute(
            "DELETE FROM _log WHERE stream = ? AND token = ? AND commit_micros < ?",
            (stream, token, cutoff),
        ).rowcount
        removed += gone
        conn.execute(
            "UPDATE _partitions SET expired_upto = MAX(COALESCE(expired_upto, ?), ?), "
            "records = MAX(records - ?, 0) WHERE stream = ? AND token = ?",
            (newest, newest, gone, stream, token))
    return removed


def expired_upto(conn: sqlite3.Connection, stream: str, token: str) -> int | None:
    """The newest commit micros that retention removed from a partition (None: nothing)."""
    row = conn.execute("SELECT expired_upto FROM _partitions WHERE stream = ? AND token = ?",
                       (stream, token)).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def drop_stream(conn: sqlite3.Connection, stream: str) -> None:
    """Remove a stream's partitions and records."""
    conn.execute("DELETE FROM _partitions WHERE stream = ?", (stream,))
    conn.execute("DELETE FROM _log WHERE stream = ?", (stream,))


# ---- source positions -----------------------------------------------------------------------


def read_position(
    conn: sqlite3.Connection, source: str
) -> tuple[dict[str, Any], int | None, int] | None:
    """(position, source micros of the last transaction, log micros of the write) or None."""
    row = conn.execute(
        "SELECT position, source_micros, appended_micros FROM _positions WHERE source = ?",
        (source,),
    ).fetchone()
    if row is None:
        return None
    return json.loads(row[0]), row[1], int(row[2])


def write_position(
    conn: sqlite3.Connection, source: str, position: dict[str, Any], source_micros: int | None,
    appended_micros: int,
) -> None:
    conn.execute(
        "INSERT INTO _positions(source, position, source_micros, appended_micros) "
        "VALUES (?, ?, ?, ?) ON CONFLICT(source) DO UPDATE SET position = excluded.position, "
        "source_micros = COALESCE(excluded.source_micros, _positions.source_micros), "
        "appended_micros = excluded.appended_micros",
        (source, json.dumps(position, sort_keys=True), source_micros, appended_micros),
    )


def delete_position(conn: sqlite3.Connection, source: str) -> None:
    conn.execute("DELETE FROM _positions WHERE source = ?", (source,))


# ---- objects of external sources ------------------------------------------------------------


def remember_object(conn: sqlite3.Connection, name: str, column_types: str) -> None:
    conn.execute("INSERT INTO _objects(name, column_types) VALUES (?, ?) ON CONFLICT(name) "
                 "DO UPDATE SET column_types = excluded.column_types", (name, column_types))


def known_objects(conn: sqlite3.Connection) -> dict[str, str]:
    """Name -> column types (JSON) of every table an external source appended."""
    return dict(conn.execute("SELECT name, column_types FROM _objects").fetchall())
