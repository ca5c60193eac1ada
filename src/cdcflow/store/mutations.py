"""Mutations of a transaction: validated when buffered, applied to rows at commit.

Semantics follow Spanner mutations: insert fails on an existing key, update and delete fail on
a missing row, insert_or_update upserts written columns, replace rewrites the whole row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from cdcflow.errors import AlreadyExists, InvalidArgument, NotFound, NotNullViolation, show
from cdcflow.model.expressions import Expression, parse_expression
from cdcflow.model.memo import IdentityMemo
from cdcflow.model.schema import Column, TableSchema
from cdcflow.model.types import (
    COMMIT_TIMESTAMP,
    ColumnType,
    decode_value,
    encode_value,
    quick_check,
    validate_value,
)

KINDS: Final = ("insert", "update", "insert_or_update", "replace", "delete")


@dataclass(frozen=True, slots=True)
class Mutation:
    kind: str
    table: str
    values: dict[str, Any]
    checked_against: TableSchema | None = None
    """The schema the values were validated against (None: not validated yet). A commit
    validates again only when the table's schema has changed since."""


@dataclass(frozen=True, slots=True)
class TableShape:
    """What the commit path asks of a schema on every row, worked out once per schema."""

    columns: dict[str, Column]
    types: dict[str, ColumnType]
    key: frozenset[str]
    empty_row: dict[str, None]
    not_null: tuple[str, ...]
    non_key: frozenset[str]
    quick: dict[str, Callable[[Any], bool]]
    """Per column, a cheap test that a value surely passes `validate_value` unchanged."""
    generated: tuple[tuple[Column, Expression], ...]
    """The stored generated columns, with their parsed expressions."""


def _shape_of(schema: TableSchema) -> TableShape:
    columns = {c.name: c for c in schema.columns}
    return TableShape(
        columns=columns,
        types={name: c.type for name, c in columns.items()},
        key=frozenset(schema.primary_key),
        empty_row=dict.fromkeys(columns),
        not_null=tuple(c.name for c in schema.columns if c.not_null),
        non_key=frozenset(columns) - frozenset(schema.primary_key),
        quick={name: quick_check(c.type) for name, c in columns.items()},
        generated=tuple((c, parse_expression(c.generated)) for c in schema.columns
                        if c.generated is not None),
    )


table_shape = IdentityMemo(_shape_of, size=256)
"""A catalog keeps one schema object per table until DDL changes it."""


def as_row(kind: str, table: str, values: object) -> dict[str, Any]:
    """A mutation's values as a new dict (of any mapping); InvalidArgument otherwise."""
    if not isinstance(values, Mapping):
        raise InvalidArgument(f"{kind} on {table!r} takes a dict of column values, not "
                              f"{show(values)} ({type(values).__name__})")
    return dict(values)


def validate_mutation(schema: TableSchema, mutation: Mutation) -> Mutation:
    """Check columns, key presence, types and NOT NULL that can be known without the row."""
    values = mutation.values
    if not isinstance(values, dict):
        raise InvalidArgument(f"{mutation.kind} on {schema.name!r} takes a dict, got "
                              f"{show(values)}")
    missing_keys = [k for k in schema.primary_key if values.get(k) is None]
    if missing_keys:
        raise InvalidArgument(
            f"{mutation.kind} on {schema.name!r} needs every primary key column; "
            f"{missing_keys} missing or NULL in {show(values)}"
        )
    shape = table_shape(schema)
    if mutation.kind == "delete" and not shape.key.issuperset(values):
        raise InvalidArgument(
            f"delete on {schema.name!r} takes only key columns {list(schema.primary_key)}, "
            f"got [{', '.join(sorted(map(show, values)))}]"
        )
    written = [column.name for column, _ in shape.generated if column.name in values]
    if written:
        raise InvalidArgument(f"{mutation.kind} on {schema.name!r} writes generated columns "
                              f"{written}; their values come from their expressions")
    checked: dict[str, Any] = {}
    quick = shape.quick
    for name, value in values.items():
        passes = quick.get(name)
        if value is not None and passes is not None and passes(value):
            checked[name] = value  # an int, str, bool or float that the full check keeps
        else:
            checked[name] = _check_value(schema, shape.columns.get(name) or schema.column(name),
                                         value)
    if mutation.kind in ("insert", "replace"):
        _require_not_null_present(schema, checked, mutation.kind)
    return Mutation(mutation.kind, mutation.table, checked, schema)


def _check_value(schema: TableSchema, column: Column, value: Any) -> Any:
    name = column.name
    if value is COMMIT_TIMESTAMP and not column.allow_commit_timestamp:
        raise InvalidArgument(
            f"column {name!r} of {schema.name!r} takes COMMIT_TIMESTAMP only with "
            "OPTIONS (allow_commit_timestamp = true)"
        )
    if value is None and column.not_null:
        raise NotNullViolation(f"column {name!r} of {schema.name!r} is NOT NULL; got None")
    return validate_value(value, column.type, name)


def _require_not_null_present(schema: TableSchema, row: dict[str, Any], kind: str) -> None:
    absent = [c.name for c in schema.columns if c.not_null and row.get(c.name) is None]
    if absent:
        raise NotNullViolation(
            f"{kind} on {schema.name!r} leaves NOT NULL columns {absent} NULL; give them values"
        )


def encode_values(
    schema: TableSchema, values: dict[str, Any], commit_text: str
) -> dict[str, Any]:
    """JSON-encode validated values, resolving COMMIT_TIMESTAMP to the commit time."""
    types = table_shape(schema).types
    return {
        name: commit_text if value is COMMIT_TIMESTAMP else encode_value(value, types[name])
        for name, value in values.items()
    }


def apply_mutation(
    schema: TableSchema,
    mutation: Mutation,
    current: dict[str, Any] | None,
    commit_text: str,
) -> dict[str, Any] | None:
    """The row after `mutation`, given the JSON-encoded `current` row (None: absent)."""
    encoded = encode_values(schema, mutation.values, commit_text)
    shape = table_shape(schema)
    empty = shape.empty_row
    kind = mutation.kind
    if kind == "insert_or_update":
        kind = "update" if current is not None else "insert"
    match kind:
        case "insert":
            if current is not None:
                raise AlreadyExists(f"row {_key_text(schema, mutation)} exists already in "
                                    f"table {schema.name!r}")
            new = empty | encoded
        case "update":
            if current is None:
                raise NotFound(f"row {_key_text(schema, mutation)} does not exist in table "
                               f"{schema.name!r}")
            new = empty | current | encoded
        case "replace":
            new = empty | encoded
        case "delete":
            if current is None:
                raise NotFound(f"row {_key_text(schema, mutation)} does not exist in table "
                               f"{schema.name!r}")
            return None
        case _:
            raise InvalidArgument(f"unknown mutation kind {kind!r}; use one of {KINDS}")
    if shape.generated:
        new |= generated_values(shape, new)
    absent = [name for name in shape.not_null if new.get(name) is None]
    if absent:
        raise NotNullViolation(
            f"{mutation.kind} on {schema.name!r} row {_key_text(schema, mutation)} leaves "
            "NOT NULL columns "
            f"{absent} NULL"
        )
    return new


def generated_values(shape: TableShape, row: dict[str, Any]) -> dict[str, Any]:
    """The JSON-encoded values of the generated columns of a JSON-encoded row."""
    names = set().union(*(expression.columns() for _, expression in shape.generated))
    decoded = {name: None if row.get(name) is None else decode_value(row[name],
                                                                       shape.types[name])
               for name in names}
    found = {}
    for column, expression in shape.generated:
        value = validate_value(expression.evaluate(decoded), column.type, column.name)
        found[column.name] = None if value is None else encode_value(value, column.type)
    return found


def _key_text(schema: TableSchema, mutation: Mutation) -> str:
    """The row's key for a message, in key order, each value cut short when long."""
    values = mutation.values
    return "{" + ", ".join(f"{k!r}: {show(values[k])}" for k in schema.primary_key) + "}"
