"""The catalog: tables and change streams stored in SQLite, and DDL applied to them.

Every DDL statement runs inside the caller's write transaction and bumps `schema_version`, so
other processes notice and reload their cached `Catalog` at their next transaction.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from cdcflow.errors import AlreadyExists, DdlError, FailedPrecondition, NotFound
from cdcflow.model.schema import (
    ChangeStreamDef,
    TableSchema,
    check_retention,
    check_value_capture_type,
)
from cdcflow.store import indexes, log, partition_map
from cdcflow.store.ddl import (
    AddColumn,
    AlterChangeStream,
    CreateChangeStream,
    CreateIndex,
    CreateTable,
    DropChangeStream,
    DropIndex,
    DropTable,
    Statement,
    StreamScope,
    parse_duration_micros,
)
from cdcflow.store.ddl_rules import check_generated
from cdcflow.store.indexes import IndexDef
from cdcflow.store.mutations import generated_values, table_shape
from cdcflow.store.sqlite import create_row_storage, read_meta, storage_name, write_meta

DEFAULT_RETENTION = "1d"
INTERNAL_PREFIX = "__"


@dataclass(frozen=True, slots=True)
class Catalog:
    """A snapshot of the schema: tables (with their row storage) and change streams."""

    version: int
    tables: dict[str, tuple[TableSchema, str]]
    streams: dict[str, ChangeStreamDef]
    indexes: dict[str, IndexDef] = field(default_factory=dict)

    def table(self, name: str) -> TableSchema:
        if name not in self.tables:
            raise NotFound(f"table {name!r} does not exist; tables are {sorted(self.tables)}")
        return self.tables[name][0]

    def storage(self, name: str) -> str:
        self.table(name)
        return self.tables[name][1]

    def stream(self, name: str) -> ChangeStreamDef:
        if name not in self.streams:
            visible = sorted(s for s in self.streams if not s.startswith(INTERNAL_PREFIX))
            raise NotFound(f"change stream {name!r} does not exist; streams are {visible}")
        return self.streams[name]

    def streams_watching(self, table: str) -> list[ChangeStreamDef]:
        return [s for s in self.streams.values() if s.watches(table)]

    def index(self, name: str) -> IndexDef:
        if name not in self.indexes:
            raise NotFound(f"index {name!r} does not exist; indexes are {sorted(self.indexes)}")
        return self.indexes[name]

    def indexes_on(self, table: str) -> list[IndexDef]:
        return [i for i in self.indexes.values() if i.table == table]


def load_catalog(conn: sqlite3.Connection, version: int) -> Catalog:
    tables = {
        name: (TableSchema.from_json(json.loads(schema)), storage)
        for name, schema, storage in conn.execute("SELECT name, schema, storage FROM _tables")
    }
    streams = {
        name: ChangeStreamDef.from_json(json.loads(definition))
        for name, definition in conn.execute("SELECT name, definition FROM _streams")
    }
    has_indexes = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                               "name = '_indexes'").fetchone()  # a file from before them,
    indexes = {  # opened without `initialise` (a reader): it has none
        name: IndexDef.from_json(name, storage, json.loads(definition))
        for name, definition, storage in (conn.execute(
            "SELECT name, definition, storage FROM _indexes") if has_indexes else ())
    }
    return Catalog(version, tables, streams, indexes)


def next_commit_micros(conn: sqlite3.Connection, now_micros: int, count: int = 1) -> int:
    """Allocate the next commit timestamp under the write lock: strictly after every earlier
    commit and after every heartbeat promise (`closed_micros`). `count` > 1 allocates that
    many consecutive ones (a batch of transactions) and returns the first."""
    micros = commit_micros_after(read_meta(conn), now_micros)
    write_meta(conn, {"last_commit_micros": micros + count - 1})
    return micros


def commit_micros_after(meta: dict[str, Any], now_micros: int) -> int:
    """The next commit timestamp given the file's meta: now, unless an earlier commit or a
    heartbeat promise (`closed_micros`) is at or after now."""
    return max(now_micros, int(meta["last_commit_micros"]) + 1, int(meta["closed_micros"]) + 1)


def apply_statement(
    conn: sqlite3.Connection,
    catalog: Catalog,
    statement: Statement,
    now_micros: int,
    initial_partitions: int,
) -> None:
    """Apply one parsed DDL statement inside the caller's write transaction."""
    match statement:
        case CreateTable(schema):
            _check_user_name(schema.name, "table")
            if schema.name in catalog.tables:
                raise AlreadyExists(f"table {schema.name!r} exists already")
            number = int(read_meta(conn)["storage_counter"]) + 1
            storage = storage_name(number)
            create_row_storage(conn, storage)
            conn.execute(
                "INSERT INTO _tables(name, schema, storage) VALUES (?, ?, ?)",
                (schema.name, json.dumps(schema.to_json()), storage),
            )
            write_meta(conn, {"storage_counter": number})
        case DropTable(name):
            _drop_table(conn, catalog, name)
        case AddColumn(table, column):
            schema = catalog.table(table)
            if schema.has_column(column.name):
                raise AlreadyExists(f"column {column.name!r} exists already in table {table!r}")
            if column.not_null:
                raise DdlError(
                    f"ALTER TABLE {table} ADD COLUMN {column.name} NOT NULL is not allowed: "
                    "existing rows would hold NULL"
                )
            grown = replace(schema, columns=(*schema.columns, column))
            check_generated(table, grown.columns, grown.primary_key)
            conn.execute(
                "UPDATE _tables SET schema = ? WHERE name = ?",
                (json.dumps(grown.to_json()), table),
            )
            if column.generated is not None:
                _fill_generated(conn, catalog.storage(table), grown)
        case CreateChangeStream(name, scope, options):
            _check_user_name(name, "change stream")
            create_stream(conn, catalog, name, scope, options, now_micros, initial_partitions)
        case AlterChangeStream(name, scope, options):
            _alter_stream(conn, catalog, name, scope, options)
        case DropChangeStream(name):
            drop_stream(conn, catalog, name)
        case CreateIndex(name, table, columns, null_filtered):
            _create_index(conn, catalog, name, table, columns, null_filtered)
        case DropIndex(name):
            _drop_index(conn, catalog.index(name))
    bump_schema_version(conn)


def _create_index(conn: sqlite3.Connection, catalog: Catalog, name: str, table: str,
                  columns: tuple[str, ...], null_filtered: bool) -> None:
    """A new index, filled from the table's newest rows in the same transaction."""
    _check_user_name(name, "index")
    if name in catalog.indexes or name in catalog.tables:
        raise AlreadyExists(f"index or table {name!r} exists already")
    schema = catalog.table(table)
    number = int(read_meta(conn)["storage_counter"]) + 1
    index = IndexDef(name, table, columns, null_filtered, f"index_{number}")
    indexes.check_index(index, schema)
    indexes.create_storage(conn, index)
    conn.execute("INSERT INTO _indexes(name, definition, storage) VALUES (?, ?, ?)",
                 (name, json.dumps(index.to_json()), index.storage))
    write_meta(conn, {"storage_counter": number})
    storage = catalog.storage(table)
    newest = conn.execute(f"SELECT key, deleted, row, MAX(commit_micros) FROM {storage} "
                          "GROUP BY key").fetchall()
    indexes.write_entries(conn, index, schema, ((key, None if deleted else json.loads(row))
                                                for key, deleted, row, _ in newest))


def _drop_index(conn: sqlite3.Connection, index: IndexDef) -> None:
    conn.execute(f"DROP TABLE {index.storage}")
    conn.execute("DELETE FROM _indexes WHERE name = ?", (index.name,))


def maintain_indexes(conn: sqlite3.Connection, catalog: Catalog,
                     rows: Iterable[tuple[TableSchema, str, dict[str, Any] | None]]) -> None:
    """Bring every index of the tables of these (schema, key, JSON-encoded row or None) up
    to date, inside the caller's write transaction."""
    by_table: dict[str, list[tuple[str, dict[str, Any] | None]]] = {}
    schemas = {}
    for schema, key, row in rows:
        if catalog.indexes_on(schema.name):
            by_table.setdefault(schema.name, []).append((key, row))
            schemas[schema.name] = schema
    for table, changed in by_table.items():
        for index in catalog.indexes_on(table):
            indexes.write_entries(conn, index, schemas[table], changed)


def _fill_generated(conn: sqlite3.Connection, storage: str, schema: TableSchema) -> None:
    """A generated column added to a table with rows: every stored version gets the value
    its own columns give (a schema change writes no change record, as in Spanner)."""
    shape = table_shape(schema)
    versions = conn.execute(f"SELECT key, commit_micros, row FROM {storage} "
                            "WHERE deleted = 0").fetchall()
    updates = []
    for key, micros, text in versions:
        row = json.loads(text)
        updates.append((json.dumps(row | generated_values(shape, row)), key, micros))
    conn.executemany(f"UPDATE {storage} SET row = ? WHERE key = ? AND commit_micros = ?",
                     updates)


def bump_schema_version(conn: sqlite3.Connection) -> None:
    conn.execute("UPDATE _meta SET value = value + 1 WHERE key = 'schema_version'")


def create_stream(
    conn: sqlite3.Connection,
    catalog: Catalog,
    name: str,
    scope: StreamScope,
    options: tuple[tuple[str, str], ...],
    now_micros: int,
    initial_partitions: int,
    internal: bool = False,
    external_tables: frozenset[str] = frozenset(),
) -> ChangeStreamDef:
    """Create a change stream; `external_tables` are tables of appended sources that the
    scope may name besides this database's own."""
    if name in catalog.streams:
        raise AlreadyExists(f"change stream {name!r} exists already")
    _check_scope(catalog, StreamScope(scope.for_all, tuple(
        (t, c) for t, c in scope.tables if t not in external_tables)))
    retention, capture = _stream_options(options, DEFAULT_RETENTION, "OLD_AND_NEW_VALUES")
    created = next_commit_micros(conn, now_micros)
    definition = ChangeStreamDef(
        name, scope.for_all, scope.tables, retention, capture, created, internal
    )
    conn.execute(
        "INSERT INTO _streams(name, definition, policy_checked_micros) VALUES (?, ?, ?)",
        (name, json.dumps(definition.to_json()), created),
    )
    partition_map.create_initial(conn, name, initial_partitions, created)
    return definition


def drop_stream(conn: sqlite3.Connection, catalog: Catalog, name: str) -> None:
    catalog.stream(name)
    conn.execute("DELETE FROM _streams WHERE name = ?", (name,))
    log.drop_stream(conn, name)
    partition_map.bump_version(conn)


def _alter_stream(
    conn: sqlite3.Connection,
    catalog: Catalog,
    name: str,
    scope: StreamScope | None,
    options: tuple[tuple[str, str], ...] | None,
) -> None:
    current = catalog.stream(name)
    _check_user_name(name, "change stream")
    altered = current
    if scope is not None:
        _check_scope(catalog, scope)
        altered = replace(altered, for_all=scope.for_all, tables=scope.tables)
    if options is not None:
        retention_text = f"{current.retention_micros // 1_000_000}s"
        retention, capture = _stream_options(
            options, retention_text, current.value_capture_type
        )
        altered = replace(altered, retention_micros=retention, value_capture_type=capture)
    conn.execute(
        "UPDATE _streams SET definition = ? WHERE name = ?",
        (json.dumps(altered.to_json()), name),
    )


def _drop_table(conn: sqlite3.Connection, catalog: Catalog, name: str) -> None:
    catalog.table(name)
    watchers = [
        s.name for s in catalog.streams.values() if any(t == name for t, _ in s.tables)
    ]
    if watchers:
        raise FailedPrecondition(
            f"table {name!r} is watched explicitly by change streams {watchers}; "
            "ALTER or DROP those streams first"
        )
    for index in catalog.indexes_on(name):
        _drop_index(conn, index)
    conn.execute(f"DROP TABLE {catalog.storage(name)}")
    conn.execute("DELETE FROM _tables WHERE name = ?", (name,))
    conn.execute("DELETE FROM _shard_streams WHERE table_name = ?", (name,))


def _check_scope(catalog: Catalog, scope: StreamScope) -> None:
    for table, columns in scope.tables:
        schema = catalog.table(table)
        for column in columns or ():
            schema.column(column)
            if column in schema.primary_key:
                raise DdlError(
                    f"column {column!r} is a key column of {table!r}; key columns are always "
                    "captured and cannot be listed"
                )


def _stream_options(
    options: tuple[tuple[str, str], ...], retention_default: str, capture_default: str
) -> tuple[int, str]:
    values = dict(options)
    unknown = set(values) - {"retention_period", "value_capture_type"}
    if unknown:
        raise DdlError(
            f"unknown change stream options {sorted(unknown)}; "
            "use retention_period and value_capture_type"
        )
    retention_text = values.get("retention_period", retention_default)
    retention = check_retention(parse_duration_micros(retention_text), retention_text)
    capture = check_value_capture_type(values.get("value_capture_type", capture_default))
    return retention, capture


def _check_user_name(name: str, kind: str) -> None:
    if name.startswith(INTERNAL_PREFIX):
        raise DdlError(f"{kind} name {name!r} starts with {INTERNAL_PREFIX!r}, which is reserved")
