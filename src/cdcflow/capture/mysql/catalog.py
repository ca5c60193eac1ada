"""What MySQL's information_schema says about the tables of some databases: columns, types
and primary keys, as `SourceObject`s named `database.table`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cdcflow.capture.mysql.connection import query
from cdcflow.capture.mysql.types import MySqlColumn, unified_type
from cdcflow.capture.source import SourceColumn, SourceObject

_COLUMNS = """
SELECT c.TABLE_SCHEMA, c.TABLE_NAME, c.COLUMN_NAME, c.DATA_TYPE, c.COLUMN_TYPE,
       c.NUMERIC_PRECISION, c.NUMERIC_SCALE, c.IS_NULLABLE, c.ORDINAL_POSITION,
       k.ORDINAL_POSITION
  FROM information_schema.COLUMNS c
  JOIN information_schema.TABLES t
    ON t.TABLE_SCHEMA = c.TABLE_SCHEMA AND t.TABLE_NAME = c.TABLE_NAME
  LEFT JOIN information_schema.KEY_COLUMN_USAGE k
    ON k.TABLE_SCHEMA = c.TABLE_SCHEMA AND k.TABLE_NAME = c.TABLE_NAME
   AND k.COLUMN_NAME = c.COLUMN_NAME AND k.CONSTRAINT_NAME = 'PRIMARY'
 WHERE t.TABLE_TYPE = 'BASE TABLE' AND c.TABLE_SCHEMA IN ({databases})
 ORDER BY c.TABLE_SCHEMA, c.TABLE_NAME, c.ORDINAL_POSITION
"""


@dataclass(frozen=True, slots=True)
class MySqlTable:
    database: str
    name: str
    columns: tuple[MySqlColumn, ...]
    nullable: tuple[bool, ...]
    key_positions: tuple[int | None, ...]

    @property
    def object_name(self) -> str:
        return f"{self.database}.{self.name}"

    def source_object(self) -> SourceObject:
        return SourceObject(self.object_name, tuple(
            SourceColumn(c.name, unified_type(c), nullable, key, index + 1)
            for index, (c, nullable, key) in enumerate(
                zip(self.columns, self.nullable, self.key_positions, strict=True))))


def read_tables(conn: Any, databases: tuple[str, ...]) -> list[MySqlTable]:
    """Every base table of `databases`, columns in order (the names are bound parameters)."""
    if not databases:
        return []
    rows = query(conn, _COLUMNS.format(databases=", ".join(["%s"] * len(databases))),
                 databases, "reading the tables of information_schema")
    grouped: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
    for row in rows:
        grouped.setdefault((_text(row[0]), _text(row[1])), []).append(row)
    return [MySqlTable(
        database, name,
        tuple(MySqlColumn(_text(r[2]), _text(r[3]).lower(), _text(r[4]), r[5], r[6])
              for r in columns),
        tuple(_text(r[7]) == "YES" for r in columns),
        tuple(None if r[9] is None else int(r[9]) for r in columns),
    ) for (database, name), columns in grouped.items()]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
