"""Binlog row events into `SourceChange`s, with the columns their table map describes. Pure.

An UPDATE whose primary key changes becomes a DELETE of the old key (`moved_to`) and an
INSERT of the new row (`moved_from`): EV-4's UPDATE-DELETE and UPDATE-INSERT for MySQL.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdcflow.capture.mysql.types import MySqlColumn, converter, unified_type
from cdcflow.errors import InvalidArgument
from cdcflow.model.changes import SourceChange
from cdcflow.model.records import ColumnTypeInfo

_TYPE_NAMES = {1: "tinyint", 2: "smallint", 3: "int", 8: "bigint", 9: "mediumint",
               4: "float", 5: "double", 0: "decimal", 246: "decimal", 7: "timestamp",
               17: "timestamp", 12: "datetime", 18: "datetime", 10: "date", 14: "date",
               11: "time", 19: "time", 13: "year", 16: "bit", 245: "json", 255: "geometry"}
_STRINGS = {15: "varchar", 253: "varchar", 254: "char", 249: "blob", 250: "blob", 251: "blob",
            252: "blob"}


def binlog_column(column: Any) -> MySqlColumn:
    """A table-map column as information_schema would describe it."""
    code = int(column.type)
    name = str(column.name)
    if getattr(column, "enum_values", None):
        members = ",".join("'" + v.replace("'", "''") + "'" for v in column.enum_values[1:])
        return MySqlColumn(name, "enum", f"enum({members})")
    if getattr(column, "set_values", None):
        members = ",".join("'" + v.replace("'", "''") + "'" for v in column.set_values)
        return MySqlColumn(name, "set", f"set({members})")
    if code in _STRINGS:
        charset = getattr(column, "character_set_name", None)
        binary = charset is None or str(charset).lower() == "binary"
        text = {"varchar": "varbinary", "char": "binary", "blob": "blob"}[_STRINGS[code]] \
            if binary else {"varchar": "varchar", "char": "char", "blob": "text"}[_STRINGS[code]]
        return MySqlColumn(name, text, text)
    if code not in _TYPE_NAMES:
        raise InvalidArgument(f"column {name!r} has binlog type {code}, which cdcflow does not "
                              "read")
    data_type = _TYPE_NAMES[code]
    unsigned = " unsigned" if getattr(column, "unsigned", False) else ""
    if data_type == "decimal":
        return MySqlColumn(name, data_type, f"decimal{unsigned}", column.precision,
                           column.decimals)
    if data_type == "bit":
        return MySqlColumn(name, data_type, f"bit({column.bits})", column.bits)
    return MySqlColumn(name, data_type, data_type + unsigned)


@dataclass(frozen=True, slots=True)
class RowShape:
    """How to turn one table map's rows into changes."""

    table: str
    names: tuple[str, ...]
    converters: tuple[Callable[[Any], Any], ...]
    keys: tuple[str, ...]
    column_types: tuple[ColumnTypeInfo, ...]

    def split(self, row: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        keys: dict[str, Any] = {}
        values: dict[str, Any] = {}
        for name, convert in zip(self.names, self.converters, strict=True):
            if name not in row:
                raise InvalidArgument(f"a row of {self.table!r} lacks column {name!r}")
            value = row[name]
            (keys if name in self.keys else values)[name] = (
                None if value is None else convert(value))
        return keys, values

    def changes(self, kind: str, row: dict[str, Any],
                position: dict[str, Any]) -> list[SourceChange]:
        def change(mod: str, keys: dict[str, Any], new: dict[str, Any],
                   at: dict[str, Any]) -> SourceChange:
            return SourceChange(self.table, mod, keys, new, {}, self.column_types, "NEW_ROW",
                                at)

        if kind == "WriteRowsEvent":
            return [change("INSERT", *self.split(row["values"]), position)]
        if kind == "DeleteRowsEvent":
            return [change("DELETE", self.split(row["values"])[0], {}, position)]
        old_keys, _ = self.split(row["before_values"])
        keys, new = self.split(row["after_values"])
        if self.keys and old_keys != keys:
            return [change("DELETE", old_keys, {}, position | {"moved_to": keys}),
                    change("INSERT", keys, new, position | {"moved_from": old_keys,
                                                            "part": 1})]
        return [change("UPDATE", keys, new, position)]


def shape_of(table: str, columns: list[Any], primary_key: Any) -> RowShape:
    """The shape of a table map's columns (mysql-replication's)."""
    return described_shape(table, [binlog_column(c) for c in columns], primary_key)


def described_shape(table: str, described: list[MySqlColumn], primary_key: Any) -> RowShape:
    """The shape of a table map's columns as `binlog_column` describes them."""
    keys = (primary_key,) if isinstance(primary_key, str) and primary_key else \
        tuple(primary_key or ())
    types = [unified_type(c) for c in described]
    return RowShape(
        table, tuple(c.name for c in described),
        tuple(converter(c, t) for c, t in zip(described, types, strict=True)), keys,
        tuple(ColumnTypeInfo(c.name, t, c.name in keys, index + 1)
              for index, (c, t) in enumerate(zip(described, types, strict=True))))
