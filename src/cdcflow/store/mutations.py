"""Mutations of a transaction: validated when buffered, applied to rows at commit.

Semantics follow Spanner mutations: insert fails on an existing key, update and delete fail on
a missing row, insert_or_update upserts written columns, replace rewrites the whole row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from cdcflow.errors import AlreadyExists, InvalidArgument, NotFound, NotNullViolation
from cdcflow.model.schema import TableSchema
from cdcflow.model.types import COMMIT_TIMESTAMP, encode_value, validate_value

KINDS: Final = ("insert", "update", "insert_or_update", "replace", "delete")


@dataclass(frozen=True, slots=True)
class Mutation:
    kind: str
    table: str
    values: dict[str, Any]


def validate_mutation(schema: TableSchema, mutation: Mutation) -> Mutation:
    """Check columns, key presence, types and NOT NULL that can be known without the row."""
    values = mutation.values
    if not isinstance(values, dict):
        raise InvalidArgument(f"{mutation.kind} on {schema.name!r} takes a dict, got {values!r}")
    missing_keys = [k for k in schema.primary_key if values.get(k) is None]
    if missing_keys:
        raise InvalidArgument(
            f"{mutation.kind} on {schema.name!r} needs every primary key column; "
            f"{missing_keys} missing or NULL in {values!r}"
        )
    if mutation.kind == "delete" and set(values) - set(schema.primary_key):
        raise InvalidArgument(
            f"delete on {schema.name!r} takes only key columns {list(schema.primary_key)}, "
            f"got {sorted(values)}"
        )
    checked: dict[str, Any] = {}
    for name, value in values.items():
        column = schema.column(name)
        if value is COMMIT_TIMESTAMP and not column.allow_commit_timestamp:
            raise InvalidArgument(
                f"column {name!r} of {schema.name!r} takes COMMIT_TIMESTAMP only with "
                "OPTIONS (allow_commit_timestamp = true)"
            )
        if value is None and column.not_null:
            raise NotNullViolation(f"column {name!r} of {schema.name!r} is NOT NULL; got None")
        checked[name] = validate_value(value, column.type, name)
    if mutation.kind in ("insert", "replace"):
        _require_not_null_present(schema, checked, mutation.kind)
    return Mutation(mutation.kind, mutation.table, checked)


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
    return {
        name: commit_text if value is COMMIT_TIMESTAMP
        else encode_value(value, schema.column(name).type)
        for name, value in values.items()
    }


def apply_mutation(
    schema: TableSchema,
    mutation: Mutation,
    current: dict[str, Any] | None,
    commit_text: str,
) -> dict[str, Any] | None:
    """The row after `mutation`, given the JSON-encoded `current` row (None: absent)."""
    key_text = {k: mutation.values[k] for k in schema.primary_key}
    encoded = encode_values(schema, mutation.values, commit_text)
    empty = {c.name: None for c in schema.columns}
    kind = mutation.kind
    if kind == "insert_or_update":
        kind = "update" if current is not None else "insert"
    match kind:
        case "insert":
            if current is not None:
                raise AlreadyExists(f"row {key_text} exists already in table {schema.name!r}")
            new = empty | encoded
        case "update":
            if current is None:
                raise NotFound(f"row {key_text} does not exist in table {schema.name!r}")
            new = empty | current | encoded
        case "replace":
            new = empty | encoded
        case "delete":
            if current is None:
                raise NotFound(f"row {key_text} does not exist in table {schema.name!r}")
            return None
        case _:
            raise InvalidArgument(f"unknown mutation kind {kind!r}; use one of {KINDS}")
    absent = [c.name for c in schema.columns if c.not_null and new.get(c.name) is None]
    if absent:
        raise NotNullViolation(
            f"{mutation.kind} on {schema.name!r} row {key_text} leaves NOT NULL columns "
            f"{absent} NULL"
        )
    return new
