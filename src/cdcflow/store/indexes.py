"""Secondary indexes of the embedded database (seed 001, CW-4): `CREATE [NULL_FILTERED]
INDEX name ON table (columns)`.

An index is a table of its own, one entry per row of the indexed table: the row's key and
its index columns as SQL values that sort as the column type does (TIMESTAMP as micros). A
NULL_FILTERED index leaves out every row with a NULL in an index column, so rows whose shard
column is NULL (processed ones, CW-7) cost it nothing. Entries are written in the commit's
own SQLite transaction (`maintain`), so a read through an index is as consistent as a read
of the table. An index holds the newest version of each row only: reads through it are
reads at now.

`poll` reads what a change watcher asks (CW-1, CW-5): rows whose first index columns
take one of some values and whose last index column, a commit timestamp, lies after a
(timestamp, key) cursor and up to a horizon, in (timestamp, key) order. Identifiers never
reach SQL: index columns are stored as c0, c1, ...
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from cdcflow.errors import DdlError, InvalidArgument
from cdcflow.model.schema import TableSchema
from cdcflow.model.timestamps import from_micros, to_micros
from cdcflow.model.types import ColumnType, decode_value
from cdcflow.store import rows

INDEXABLE = ("INT64", "STRING", "BOOL", "TIMESTAMP", "DATE", "FLOAT64", "BYTES")


@dataclass(frozen=True, slots=True)
class IndexDef:
    name: str
    table: str
    columns: tuple[str, ...]
    null_filtered: bool
    storage: str

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "columns": list(self.columns),
                "null_filtered": self.null_filtered}

    @staticmethod
    def from_json(name: str, storage: str, data: dict[str, Any]) -> IndexDef:
        return IndexDef(name, data["table"], tuple(data["columns"]), data["null_filtered"],
                        storage)


def check_index(index: IndexDef, schema: TableSchema) -> None:
    for name in index.columns:
        if not schema.has_column(name):
            raise DdlError(f"index {index.name!r}: {name!r} is not a column of table "
                           f"{schema.name!r}")
        code = schema.column(name).type.code
        if code not in INDEXABLE:
            raise DdlError(f"index {index.name!r}: column {name!r} is {code}; an index takes "
                           f"{', '.join(INDEXABLE)}")
    if len(set(index.columns)) != len(index.columns):
        raise DdlError(f"index {index.name!r} repeats a column: {list(index.columns)}")


def create_storage(conn: sqlite3.Connection, index: IndexDef) -> None:
    slots = ", ".join(f"c{i}" for i in range(len(index.columns)))
    conn.execute(f"CREATE TABLE {index.storage} (key TEXT PRIMARY KEY, {slots}) WITHOUT ROWID")
    conn.execute(f"CREATE INDEX {index.storage}_order ON {index.storage} ({slots}, key)")


def sql_value(encoded: Any, ctype: ColumnType) -> Any:
    """A JSON-encoded value as an SQL value that sorts as its type does."""
    return None if encoded is None else to_sql(decode_value(encoded, ctype))


def entry(index: IndexDef, schema: TableSchema, key: str,
          row: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """The index entry of a JSON-encoded row (None: deleted, or filtered out for a NULL)."""
    if row is None:
        return None
    values = tuple(sql_value(row.get(c), schema.column(c).type) for c in index.columns)
    if index.null_filtered and any(v is None for v in values):
        return None
    return (key, *values)


def write_entries(conn: sqlite3.Connection, index: IndexDef, schema: TableSchema,
                  rows: Iterable[tuple[str, dict[str, Any] | None]]) -> None:
    """Bring the entries of these (key, JSON-encoded row or None) up to date."""
    gone, put = [], []
    for key, row in rows:
        gone.append((key,))
        found = entry(index, schema, key, row)
        if found is not None:
            put.append(found)
    conn.executemany(f"DELETE FROM {index.storage} WHERE key = ?", gone)
    marks = ", ".join("?" * (len(index.columns) + 1))
    conn.executemany(f"INSERT INTO {index.storage} VALUES ({marks})", put)


def poll_statement(index: IndexDef, prefix: Sequence[Sequence[Any]], after: bool,
                   up_to: bool, limit: int) -> str:
    """The SQL of a poll: `prefix[i]` are the values the i-th index column may take; the
    column after them is the cursor column (c_n > t, or = t with key > k), up to a bound."""
    if not 1 <= len(index.columns) - len(prefix) <= 1:
        raise InvalidArgument(f"a poll of index {index.name!r} ({list(index.columns)}) "
                              "filters every index column but the last, the cursor column")
    if limit < 1:
        raise InvalidArgument(f"poll limit {limit} must be at least 1")
    cursor = f"c{len(prefix)}"
    where = [f"c{i} IN ({', '.join('?' * len(values))})" for i, values in enumerate(prefix)]
    where.append(f"{cursor} IS NOT NULL")
    if after:
        where.append(f"({cursor} > ? OR ({cursor} = ? AND key > ?))")
    if up_to:
        where.append(f"{cursor} <= ?")
    return (f"SELECT key, {cursor} FROM {index.storage} WHERE {' AND '.join(where)} "
            f"ORDER BY {cursor}, key LIMIT {int(limit)}")


def to_sql(value: Any) -> Any:
    """A Python value (as a caller passes it) as the index's SQL value."""
    if isinstance(value, datetime):
        return to_micros(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, bool):
        return int(value)
    return value


def poll_arguments(prefix: Sequence[Sequence[Any]], after: tuple[Any, str] | None,
                   up_to: Any) -> list[Any]:
    arguments = [to_sql(v) for values in prefix for v in values]
    if after is not None:
        arguments += [to_sql(after[0]), to_sql(after[0]), after[1]]
    if up_to is not None:
        arguments.append(to_sql(up_to))
    return arguments


@dataclass(frozen=True, slots=True)
class PolledRow:
    """A row read through an index: its cursor value (as the column's Python value), its
    encoded key (the cursor's tie-breaker), and the row."""

    cursor: Any
    key: str
    row: dict[str, Any]


def poll(conn: sqlite3.Connection, index: IndexDef, schema: TableSchema, storage: str,
         prefix: Sequence[Sequence[Any]], after: tuple[Any, str] | None, up_to: Any,
         limit: int) -> list[PolledRow]:
    """Rows through `index` (see `poll_statement`), inside the caller's read transaction."""
    statement = poll_statement(index, prefix, after is not None, up_to is not None, limit)
    found = conn.execute(statement, poll_arguments(prefix, after, up_to)).fetchall()
    newest = rows.latest_versions(conn, storage, [key for key, _ in found])
    ctype = schema.column(index.columns[len(prefix)]).type
    return [PolledRow(from_micros(cursor) if ctype.code == "TIMESTAMP" else cursor, key,
                      rows.decode_row(schema, newest[key] or {}))
            for key, cursor in found if newest[key] is not None]


def explain(conn: sqlite3.Connection, index: IndexDef, prefix: Sequence[Sequence[Any]],
            after: tuple[Any, str] | None, up_to: Any, limit: int) -> list[str]:
    """SQLite's plan for a poll: the details of EXPLAIN QUERY PLAN, one line per step."""
    statement = poll_statement(index, prefix, after is not None, up_to is not None, limit)
    plan = conn.execute(f"EXPLAIN QUERY PLAN {statement}", poll_arguments(prefix, after, up_to))
    return [str(row[-1]) for row in plan.fetchall()]
