"""Arrow types of the table's columns, from pyarrow schemas or column DDL text."""

from __future__ import annotations

import base64
from typing import Any

import pyarrow as pa

from cdcflow.errors import InvalidArgument
from cdcflow.model.types import ColumnType, parse_type

PSEUDO_COLUMNS = ("_CHANGE_TYPE", "_CHANGE_SEQUENCE_NUMBER")
MAX_COLUMNS = 2_000


def arrow_type(ctype: ColumnType) -> Any:
    match ctype.code:
        case "ARRAY":
            assert ctype.element is not None
            return pa.list_(arrow_type(ctype.element))
        case "INT64":
            return pa.int64()
        case "FLOAT64":
            return pa.float64()
        case "BOOL":
            return pa.bool_()
        case "BYTES":
            return pa.binary()
        case "NUMERIC":
            if ctype.precision is not None:
                return pa.decimal128(ctype.precision, ctype.scale or 0)
            return pa.decimal128(38, 9)
        case "DATE":
            return pa.date32()
        case "TIMESTAMP":
            return pa.timestamp("us", tz="UTC")
        case _:
            return pa.string()


def schema_from_ddl(text: str) -> pa.Schema:
    """`id INT64 NOT NULL, name STRING(MAX), ...` as an Arrow schema."""
    fields = []
    depth, current, parts = 0, "", []
    for char in text:
        depth += char in "(<"
        depth -= char in ")>"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    for part in (p.strip() for p in parts if p.strip()):
        words = part.split(None, 1)
        if len(words) != 2:
            raise InvalidArgument(f"column definition {part!r} needs a name and a type")
        name, rest = words
        nullable = not rest.upper().rstrip().endswith("NOT NULL")
        type_text = rest[: rest.upper().rfind("NOT NULL")] if not nullable else rest
        fields.append(pa.field(name, arrow_type(parse_type(type_text.strip())), nullable))
    return pa.schema(fields)


def check_schema(schema: pa.Schema, primary_key: list[str]) -> None:
    """AP-2 and AP-10: 1..16 key columns that exist, at most 2,000 columns, no pseudo-columns."""
    names = schema.names
    if len(names) > MAX_COLUMNS:
        raise InvalidArgument(f"a table has at most {MAX_COLUMNS} columns, got {len(names)}")
    if len(set(names)) != len(names):
        raise InvalidArgument(f"column names repeat: {names}")
    for name in names:
        if name.upper() in PSEUDO_COLUMNS or name.startswith("_cdcflow"):
            raise InvalidArgument(f"column name {name!r} is reserved for change metadata")
    if not 1 <= len(primary_key) <= 16:
        raise InvalidArgument(
            f"primary key {primary_key} must have 1 to 16 columns (AP-2), got {len(primary_key)}"
        )
    for column in primary_key:
        if column not in names:
            raise InvalidArgument(f"primary key column {column!r} is not in the schema {names}")
        if pa.types.is_nested(schema.field(column).type):
            raise InvalidArgument(f"primary key column {column!r} has type "
                                  f"{schema.field(column).type}; key columns take scalar types, "
                                  "not ARRAY or STRUCT (AP-2)")
    if len(set(primary_key)) != len(primary_key):
        raise InvalidArgument(f"primary key {primary_key} repeats a column")


def fields_to_json(fields: list[pa.Field]) -> str:
    """Arrow fields as text (the Arrow IPC schema, base64), to send between processes."""
    return base64.b64encode(pa.schema(fields).serialize().to_pybytes()).decode()


def fields_from_json(text: str) -> list[pa.Field]:
    return list(pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text))))
