"""MySQL/MariaDB column types onto cdcflow's unified types, and their values (as PyMySQL reads
them in a snapshot and mysql-replication decodes them from the binlog) into the record
encoding. Pure. Both paths go through the same converter, so a value is identical whichever
way it arrives.

| MySQL | unified |
|---|---|
| TINYINT .. BIGINT, signed; TINYINT .. INT UNSIGNED; YEAR | INT64 |
| BIGINT UNSIGNED, BIT(64) | NUMERIC(20, 0), exact above 2^63 |
| BIT(n), n < 64 | INT64 |
| DECIMAL(p, s), p <= 38 | NUMERIC(p, s) |
| DECIMAL(p, s), p > 38 | STRING (exact text) |
| FLOAT, DOUBLE | FLOAT64 |
| DATE | DATE |
| DATETIME, TIMESTAMP (fractions kept) | TIMESTAMP (a DATETIME is read as UTC) |
| JSON | JSON |
| BINARY, VARBINARY, BLOBs, GEOMETRY | BYTES |
| CHAR, VARCHAR, TEXTs, ENUM, SET, TIME and the rest | STRING |
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from cdcflow.errors import InvalidArgument
from cdcflow.model.types import ColumnType, encode_value, validate_value

_SIGNED = {"tinyint", "smallint", "mediumint", "int", "integer", "bigint"}
_BYTES = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "geometry",
          "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon",
          "geometrycollection"}
_MAX_PRECISION = 38


@dataclass(frozen=True, slots=True)
class MySqlColumn:
    """What information_schema says of a column."""

    name: str
    data_type: str  # DATA_TYPE, lower case: int, varchar, decimal...
    column_type: str  # COLUMN_TYPE: int(10) unsigned, enum('a','b'), tinyint(1)...
    precision: int | None = None  # NUMERIC_PRECISION
    scale: int | None = None  # NUMERIC_SCALE

    @property
    def unsigned(self) -> bool:
        return "unsigned" in self.column_type.lower()

    def members(self) -> tuple[str, ...]:
        """An ENUM's or SET's values in definition order (from COLUMN_TYPE)."""
        inner = self.column_type[self.column_type.index("(") + 1:self.column_type.rindex(")")]
        return tuple(part[1:-1].replace("''", "'") for part in _quoted(inner))


def unified_type(column: MySqlColumn) -> ColumnType:
    name = column.data_type.lower()
    if name == "bigint" and column.unsigned:
        return ColumnType("NUMERIC", precision=20, scale=0)
    if name in _SIGNED or name == "year":
        return ColumnType("INT64")
    if name == "bit":
        width = column.precision or 1
        return ColumnType("NUMERIC", precision=20, scale=0) if width >= 64 else \
            ColumnType("INT64")
    if name in ("decimal", "numeric"):
        precision, scale = column.precision or 10, column.scale or 0
        if precision > _MAX_PRECISION:
            return ColumnType("STRING")
        return ColumnType("NUMERIC", precision=precision, scale=scale)
    if name in ("float", "double", "real"):
        return ColumnType("FLOAT64")
    if name == "date":
        return ColumnType("DATE")
    if name in ("datetime", "timestamp"):
        return ColumnType("TIMESTAMP")
    if name == "json":
        return ColumnType("JSON")
    if name in _BYTES:
        return ColumnType("BYTES")
    return ColumnType("STRING")


def converter(column: MySqlColumn, ctype: ColumnType) -> Callable[[Any], Any]:
    """A function from a read value (not None) to its record encoding."""
    name = column.data_type.lower()
    if name == "set":
        order = {member: index for index, member in enumerate(column.members())}

        def convert_set(value: Any) -> Any:
            parts = value if isinstance(value, set | frozenset) else (
                [p for p in str(value).split(",") if p])
            return ",".join(sorted(parts, key=lambda p: order.get(p, len(order))))

        return convert_set

    def convert(value: Any) -> Any:
        return encode_value(validate_value(_normal(name, ctype, value), ctype, column.name),
                            ctype)

    return convert


def _quoted(text: str) -> list[str]:
    """'a','b''c' -> ["'a'", "'b''c'"]: split at commas outside quotes."""
    parts, current, quoted, index = [], "", False, 0
    while index < len(text):
        char = text[index]
        if char == "'" and quoted and text[index + 1:index + 2] == "'":
            current += "''"
            index += 2
            continue
        if char == "'":
            quoted = not quoted
        if char == "," and not quoted:
            parts.append(current)
            current = ""
        else:
            current += char
        index += 1
    if current:
        parts.append(current)
    return parts


def _normal(name: str, ctype: ColumnType, value: Any) -> Any:
    """A value as the unified type's Python value, from either reader's representation."""
    if name == "bit":
        return _bits(value) if ctype.code == "INT64" else Decimal(_bits(value))
    if ctype.code == "NUMERIC":
        return Decimal(value) if not isinstance(value, Decimal) else value
    if ctype.code == "TIMESTAMP":
        return _timestamp(value)
    if ctype.code == "JSON":
        return json.loads(value) if isinstance(value, str | bytes) else value
    if ctype.code == "BYTES":
        return value.encode("latin-1") if isinstance(value, str) else bytes(value)
    if ctype.code == "STRING":
        return _text(name, value)
    return value


def _bits(value: Any) -> int:
    if isinstance(value, bytes):
        return int.from_bytes(value, "big")
    if isinstance(value, str):  # mysql-replication: '0101'
        return int(value, 2) if value else 0
    return int(value)


def _timestamp(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value
    raise InvalidArgument(f"timestamp value {value!r} is not a datetime (a zero date?)")


def _text(name: str, value: Any) -> str:
    if isinstance(value, timedelta):  # TIME
        return _time_text(value)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, date):
        return value.isoformat()
    return str(value)


def _time_text(value: timedelta) -> str:
    micros = value // timedelta(microseconds=1)
    sign = "-" if micros < 0 else ""
    micros = abs(micros)
    seconds, fraction = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hours, minute = divmod(minutes, 60)
    text = f"{sign}{hours:02d}:{minute:02d}:{second:02d}"
    return f"{text}.{fraction:06d}" if fraction else text
