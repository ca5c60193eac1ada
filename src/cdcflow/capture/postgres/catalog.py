"""What PostgreSQL's catalog says about tables: columns, types, keys, replica identity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cdcflow.capture.postgres.types import PgType, unified_type
from cdcflow.capture.source import SourceColumn, SourceObject

_TABLES = """
SELECT c.oid, n.nspname, c.relname, c.relreplident, a.attname, a.atttypid, a.atttypmod,
       a.attnotnull,
       (SELECT k.position FROM pg_index i, unnest(i.indkey) WITH ORDINALITY AS k(num, position)
         WHERE i.indrelid = c.oid AND i.indisprimary AND k.num = a.attnum)
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_attribute a ON a.attrelid = c.oid
 WHERE c.relkind = 'r' AND NOT c.relispartition
   AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname !~ '^pg_'
   AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
 ORDER BY n.nspname, c.relname, a.attnum
"""
_PRIMARY_KEY = """
SELECT a.attname FROM pg_index i, unnest(i.indkey) WITH ORDINALITY AS k(num, position),
       pg_attribute a
 WHERE i.indrelid = %s AND i.indisprimary AND a.attrelid = i.indrelid AND a.attnum = k.num
 ORDER BY k.position
"""
_TYPES = "SELECT oid, typname, typtype, typelem, typbasetype, typcategory FROM pg_type " \
         "WHERE oid = ANY(%s)"


@dataclass(frozen=True, slots=True)
class PgColumn:
    name: str
    type_oid: int
    type_modifier: int
    not_null: bool
    key_position: int | None


@dataclass(frozen=True, slots=True)
class PgTable:
    oid: int
    schema: str
    name: str
    replica_identity: str
    columns: tuple[PgColumn, ...]

    @property
    def object_name(self) -> str:
        return f"{self.schema}.{self.name}"


def read_tables(conn: Any) -> list[PgTable]:
    """Every ordinary table outside the system schemas, columns in order."""
    with conn.cursor() as cur:
        cur.execute(_TABLES)
        rows = cur.fetchall()
    tables: dict[int, PgTable] = {}
    for oid, schema, name, identity, column, type_oid, modifier, not_null, key in rows:
        found = tables.get(oid) or PgTable(oid, schema, name, identity, ())
        item = PgColumn(column, type_oid, modifier, not_null, key)
        tables[oid] = PgTable(oid, schema, name, identity, (*found.columns, item))
    return list(tables.values())


def primary_key(conn: Any, table_oid: int) -> tuple[str, ...]:
    """The primary key columns of a table, in key order (empty: it has none). (A Relation
    message's key flags mark the replica identity, the whole row under FULL.)"""
    with conn.cursor() as cur:
        cur.execute(_PRIMARY_KEY, (table_oid,))
        return tuple(name for (name,) in cur.fetchall())


class TypeCache:
    """PgType of each type OID, asked of the catalog once (domains resolve to their base
    type, arrays carry their element)."""

    def __init__(self) -> None:
        self._rows: dict[int, tuple[str, str, int, int, str]] = {}

    def load(self, conn: Any, oids: set[int]) -> None:
        wanted = {o for o in oids if o not in self._rows}
        while wanted:
            with conn.cursor() as cur:
                cur.execute(_TYPES, (list(wanted),))
                for oid, name, kind, element, base, category in cur.fetchall():
                    self._rows[oid] = (name, kind, element, base, category)
            wanted = {o for row in (self._rows[w] for w in wanted if w in self._rows)
                      for o in (row[2], row[3]) if o and o not in self._rows}

    def pg_type(self, oid: int) -> PgType:
        name, kind, element, base, category = self._rows[oid]
        if kind == "d" and base:
            return self.pg_type(base)
        if category == "A" and element:
            return PgType(name, kind, self.pg_type(element))
        return PgType(name, kind)


def source_object(table: PgTable, types: TypeCache,
                  primary_key: tuple[str, ...] | None = None,
                  numeric: dict[str, tuple[int, int]] | None = None) -> SourceObject:
    """The object of a table; `primary_key` names key columns for a table without one;
    `numeric` gives precisions by column name for unconstrained numerics."""
    keys = list(primary_key) if primary_key else [
        c.name for c in sorted((c for c in table.columns if c.key_position),
                               key=lambda c: c.key_position or 0)]
    return SourceObject(table.object_name, tuple(
        SourceColumn(c.name,
                     unified_type(types.pg_type(c.type_oid), c.type_modifier,
                                  (numeric or {}).get(c.name)),
                     not c.not_null, keys.index(c.name) + 1 if c.name in keys else None,
                     ordinal)
        for ordinal, c in enumerate(table.columns, start=1)))
