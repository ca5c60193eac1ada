"""Table schemas and change-stream definitions as frozen values with JSON round trips."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from typing import Any, Final

from cdcflow.errors import InvalidArgument, NotFound, show
from cdcflow.model.types import ColumnType, encode_value

VALUE_CAPTURE_TYPES: Final = (
    "OLD_AND_NEW_VALUES",
    "NEW_VALUES",
    "NEW_ROW",
    "NEW_ROW_AND_OLD_VALUES",
)
MIN_RETENTION_MICROS: Final = 3_600 * 1_000_000
MAX_RETENTION_MICROS: Final = 30 * 86_400 * 1_000_000
MAX_PRIMARY_KEY_COLUMNS: Final = 16
KEY_HASH_SPACE: Final = 1 << 62
"""Partitions cover ranges of [0, KEY_HASH_SPACE) over a hash of (table, primary key)."""


@dataclass(frozen=True, slots=True)
class Column:
    """One column: name, type, NOT NULL, whether it takes the commit-timestamp placeholder,
    and for a stored generated column its expression (`cdcflow.model.expressions`)."""

    name: str
    type: ColumnType
    not_null: bool = False
    allow_commit_timestamp: bool = False
    generated: str | None = None

    def to_json(self) -> dict[str, Any]:
        found = {
            "name": self.name,
            "type": self.type.to_json() | _length_json(self.type),
            "not_null": self.not_null,
            "allow_commit_timestamp": self.allow_commit_timestamp,
        }
        if self.generated is not None:
            found["generated"] = self.generated
        return found

    @staticmethod
    def from_json(data: dict[str, Any]) -> Column:
        return Column(
            name=data["name"],
            type=_type_from_json(data["type"]),
            not_null=data["not_null"],
            allow_commit_timestamp=data["allow_commit_timestamp"],
            generated=data.get("generated"),
        )


def _length_json(ctype: ColumnType) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if ctype.length is not None:
        out["length"] = ctype.length
    if ctype.element is not None and ctype.element.length is not None:
        out["element_length"] = ctype.element.length
    return out


def _type_from_json(data: dict[str, Any]) -> ColumnType:
    base = ColumnType.from_json(data)
    if base.element is not None and "element_length" in data:
        return replace(base, element=replace(base.element, length=data["element_length"]))
    return replace(base, length=data.get("length"))


@dataclass(frozen=True, slots=True)
class TableSchema:
    """A table: ordered columns and a primary key of 1..16 of them."""

    name: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]

    def column(self, name: str) -> Column:
        for col in self.columns:
            if col.name == name:
                return col
        raise NotFound(
            f"column {show(name)} does not exist in table {self.name!r}; "
            f"its columns are {[c.name for c in self.columns]}"
        )

    def has_column(self, name: str) -> bool:
        return any(c.name == name for c in self.columns)

    @property
    def non_key_columns(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.name not in self.primary_key)

    @property
    def key_columns(self) -> tuple[Column, ...]:
        return tuple(self.column(name) for name in self.primary_key)

    def ordinal(self, name: str) -> int:
        """1-based position of the column in the schema (CS-7 ordinal_position)."""
        for index, col in enumerate(self.columns, start=1):
            if col.name == name:
                return index
        raise NotFound(f"column {name!r} does not exist in table {self.name!r}")

    def key_of(self, row: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(row[name] for name in self.primary_key)

    def encode_key(self, key: tuple[Any, ...]) -> str:
        """Canonical text of a primary key, used for storage identity and hashing."""
        if all(type(v) is int for v in key):  # what json.dumps writes for integers
            return "[" + ",".join(map(str, key)) + "]"
        encoded = [encode_value(v, c.type) for v, c in zip(key, self.key_columns, strict=True)]
        return json.dumps(encoded, separators=(",", ":"))

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "columns": [c.to_json() for c in self.columns],
            "primary_key": list(self.primary_key),
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> TableSchema:
        return TableSchema(
            name=data["name"],
            columns=tuple(Column.from_json(c) for c in data["columns"]),
            primary_key=tuple(data["primary_key"]),
        )


def key_hash(table: str, encoded_key: str) -> int:
    """Position of a row in the partition hash space [0, KEY_HASH_SPACE)."""
    digest = hashlib.blake2b(f"{table}\x00{encoded_key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 2


@dataclass(frozen=True, slots=True)
class ChangeStreamDef:
    """A change stream: what it watches (FOR ALL or tables with optional column lists) and options.

    `tables` maps a table to its watched non-key columns; None means every column.
    """

    name: str
    for_all: bool
    tables: tuple[tuple[str, tuple[str, ...] | None], ...]
    retention_micros: int
    value_capture_type: str
    created_micros: int
    internal: bool = False

    def watches(self, table: str) -> bool:
        return self.for_all or any(name == table for name, _ in self.tables)

    def watched_columns(self, schema: TableSchema) -> tuple[str, ...]:
        """Non-key columns of `schema` this stream captures, in schema order."""
        if self.for_all:
            return tuple(c.name for c in schema.non_key_columns)
        for name, columns in self.tables:
            if name == schema.name:
                if columns is None:
                    return tuple(c.name for c in schema.non_key_columns)
                return tuple(c.name for c in schema.non_key_columns if c.name in columns)
        return ()

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "for_all": self.for_all,
            "tables": [[t, list(c) if c is not None else None] for t, c in self.tables],
            "retention_micros": self.retention_micros,
            "value_capture_type": self.value_capture_type,
            "created_micros": self.created_micros,
            "internal": self.internal,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> ChangeStreamDef:
        return ChangeStreamDef(
            name=data["name"],
            for_all=data["for_all"],
            tables=tuple((t, tuple(c) if c is not None else None) for t, c in data["tables"]),
            retention_micros=data["retention_micros"],
            value_capture_type=data["value_capture_type"],
            created_micros=data["created_micros"],
            internal=data.get("internal", False),
        )


def check_retention(micros: int, text: str) -> int:
    if not MIN_RETENTION_MICROS <= micros <= MAX_RETENTION_MICROS:
        raise InvalidArgument(
            f"retention_period {text!r} is outside the allowed range of 1 hour to 30 days"
        )
    return micros


def check_value_capture_type(value: str) -> str:
    if value not in VALUE_CAPTURE_TYPES:
        raise InvalidArgument(
            f"value_capture_type {value!r} is not one of {', '.join(VALUE_CAPTURE_TYPES)}"
        )
    return value
