"""Rules a parsed table definition must follow: columns, primary key, generated columns."""

from __future__ import annotations

from cdcflow.errors import DdlError, show
from cdcflow.model.expressions import parse_expression
from cdcflow.model.schema import MAX_PRIMARY_KEY_COLUMNS, Column, TableSchema
from cdcflow.model.types import MAX_BYTES_LENGTH, MAX_STRING_LENGTH


def checked_length(code: str, size: str) -> int:
    """The n of STRING(n) or BYTES(n): an integer from 1 up to the type's limit."""
    limit = MAX_STRING_LENGTH if code == "STRING" else MAX_BYTES_LENGTH
    if not (size.isascii() and size.isdigit()) or len(size) > 9 or not 1 <= int(size) <= limit:
        raise DdlError(f"{code} length {show(size)} must be MAX or an integer in 1..{limit}")
    return int(size)


def check_generated(table: str, columns: list[Column] | tuple[Column, ...],
                    key: list[str] | tuple[str, ...]) -> None:
    """A generated column's expression names only the table's columns that are not
    generated themselves."""
    plain = {c.name for c in columns if c.generated is None}
    for column in columns:
        if column.generated is None:
            continue
        if column.name in key:
            raise DdlError(f"generated column {column.name!r} of table {table!r} cannot be "
                           "part of its primary key")
        unknown = sorted(parse_expression(column.generated).columns() - plain)
        if unknown:
            raise DdlError(f"generated column {column.name!r} of table {table!r} refers to "
                           f"{unknown}, which are not columns of it that are not generated")
        if column.type.code not in ("INT64", "STRING", "BOOL", "BYTES"):
            raise DdlError(f"generated column {column.name!r} must be INT64, STRING, BOOL or "
                           f"BYTES, not {column.type.ddl()}")


def checked_schema(name: str, columns: list[Column], key: list[str]) -> TableSchema:
    names = [c.name for c in columns]
    if not columns:
        raise DdlError(f"table {name!r} needs at least one column")
    if len(set(names)) != len(names):
        raise DdlError(f"table {name!r} declares a column twice: {names}")
    if not 1 <= len(key) <= MAX_PRIMARY_KEY_COLUMNS:
        raise DdlError(
            f"table {name!r} has {len(key)} primary key columns; use 1 to "
            f"{MAX_PRIMARY_KEY_COLUMNS}"
        )
    for part in key:
        if part not in names:
            raise DdlError(f"primary key column {part!r} is not a column of table {name!r}")
    if len(set(key)) != len(key):
        raise DdlError(f"primary key of table {name!r} repeats a column: {key}")
    check_generated(name, columns, key)
    for column in columns:
        if column.name in key and column.type.code in ("ARRAY", "JSON"):
            raise DdlError(
                f"column {column.name!r} of type {column.type.ddl()} cannot be a key column"
            )
    return TableSchema(name, tuple(columns), tuple(key))
