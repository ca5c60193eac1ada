"""Committed source transactions, as external sources hand them to the change log.

A `SourceTransaction` is what a capture worker read from its source: the row changes of one
committed transaction, in the order the source applied them, with the source block
(`SourceMetadata`). Values use the record encoding of `cdcflow.model.types`, and
`column_types` (CS-7) says how to decode them. `validate_transaction` checks every rule that
can be known without the log, so a bad transaction is refused before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from cdcflow.errors import InvalidArgument
from cdcflow.model.records import MOD_TYPES, ColumnTypeInfo
from cdcflow.model.schema import VALUE_CAPTURE_TYPES
from cdcflow.model.source import ChangeContext, SourceKind, SourceMetadata, kind_of
from cdcflow.model.types import decode_value, quick_check, validate_value


@dataclass(frozen=True, slots=True)
class SourceChange:
    """One row change: keys (the primary key; empty for a table without one), non-key new and
    old values, the columns' types, what the values capture (`value_capture_type`, e.g.
    NEW_ROW when the new values are the whole row) and the change's own position fields."""

    table: str
    mod_type: str
    keys: dict[str, Any]
    new_values: dict[str, Any]
    old_values: dict[str, Any]
    column_types: tuple[ColumnTypeInfo, ...]
    value_capture_type: str = "NEW_ROW"
    position: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SourceTransaction:
    """The changes of one committed source transaction, in source order, and its block."""

    metadata: SourceMetadata
    changes: tuple[SourceChange, ...]


def validate_transaction(transaction: SourceTransaction) -> None:
    """Raise InvalidArgument naming the change and the rule it breaks; return if all hold."""
    kind = validate_metadata(transaction.metadata)
    if not transaction.changes:
        raise InvalidArgument("a source transaction needs at least one change")
    for index, change in enumerate(transaction.changes):
        validate_change(kind, transaction.metadata, index, change)


def validate_metadata(metadata: SourceMetadata) -> SourceKind:
    """The block's rules; returns its kind."""
    kind = kind_of(metadata.read_method)  # a CDC or a backfill method (a table backfilled
    # again while the stream goes on comes through the log too)
    if metadata.source_timestamp.tzinfo is None:
        raise InvalidArgument(f"source_timestamp {metadata.source_timestamp!r} has no timezone")
    _check_json("the transaction's position", metadata.position)
    return kind


def validate_change(kind: SourceKind, metadata: SourceMetadata, index: int,
                    change: SourceChange) -> None:
    """The rules of change number `index` of a transaction."""
    try:
        _validate_change(change)
        _check_position(kind, metadata, change)
    except InvalidArgument as error:
        raise InvalidArgument(f"change {index} of transaction {metadata.tx_id!r}: "
                              f"{error}") from None


_STRICT_JSON = (orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
                | orjson.OPT_PASSTHROUGH_SUBCLASS)
"""orjson would write datetimes and dataclasses as text; a position holds plain JSON only."""


_PLAIN = frozenset({str, int, float, bool, type(None)})
"""Values that are JSON as they are, so a position of only these needs no encoding."""


def _check_json(what: str, value: dict[str, Any]) -> None:
    if not value or all(v.__class__ in _PLAIN for v in value.values()):
        return
    try:
        orjson.dumps(value, option=_STRICT_JSON)
    except (TypeError, orjson.JSONEncodeError) as error:
        raise InvalidArgument(f"{what} {value!r} is not JSON: {error}") from None


def _check_position(kind: SourceKind, metadata: SourceMetadata, change: SourceChange) -> None:
    """The position fields EV-6 orders this kind's events by must be there (e.g. an LSN)."""
    _check_json("position", change.position)
    kind.sort_keys(ChangeContext(metadata, metadata.position | change.position, 0, "", "", 0))


@dataclass(frozen=True, slots=True)
class _Shape:
    """What checking a change needs of its column types, worked out once per tuple."""

    column_types: tuple[ColumnTypeInfo, ...]
    types: dict[str, ColumnTypeInfo]
    key_names: frozenset[str]
    quick_values: dict[str, Callable[[Any], bool]]
    """Non-key columns: a cheap test that a value surely passes (else the full check)."""
    quick_keys: dict[str, Callable[[Any], bool]]


_SHAPES: dict[int, _Shape] = {}


def _shape(column_types: tuple[ColumnTypeInfo, ...]) -> _Shape:
    found = _SHAPES.get(id(column_types))
    if found is None or found.column_types is not column_types:
        types = {c.name: c for c in column_types}
        if len(types) != len(column_types):
            raise InvalidArgument("column_types name a column twice")
        if len(_SHAPES) > 1024:
            _SHAPES.clear()
        quick = {c.name: quick_check(c.type) for c in column_types}
        keys = frozenset(c.name for c in column_types if c.is_primary_key)
        found = _Shape(column_types, types, keys,
                       {n: f for n, f in quick.items() if n not in keys},
                       {n: f for n, f in quick.items() if n in keys})
        _SHAPES[id(column_types)] = found
    return found


def _validate_change(change: SourceChange) -> None:
    if not isinstance(change.table, str) or not change.table:
        raise InvalidArgument(f"table {change.table!r} must be a non-empty name")
    if change.mod_type not in MOD_TYPES:
        raise InvalidArgument(f"mod_type {change.mod_type!r} is not one of {MOD_TYPES}")
    if change.value_capture_type not in VALUE_CAPTURE_TYPES:
        raise InvalidArgument(f"value_capture_type {change.value_capture_type!r} is not one of "
                              f"{VALUE_CAPTURE_TYPES}")
    try:
        shape = _shape(change.column_types)
    except InvalidArgument:
        raise InvalidArgument(f"column_types of {change.table!r} name a column twice") from None
    if change.keys.keys() != shape.key_names:
        raise InvalidArgument(f"keys {sorted(change.keys)} of {change.table!r} must be exactly "
                              f"its primary key columns {sorted(shape.key_names)}")
    if None in change.keys.values():
        raise InvalidArgument(f"keys {change.keys!r} of {change.table!r} hold NULL")
    if change.mod_type == "INSERT" and change.old_values:
        raise InvalidArgument("an INSERT has no old values")
    if change.mod_type == "DELETE" and change.new_values:
        raise InvalidArgument("a DELETE has no new values")
    for part, quick in ((change.keys, shape.quick_keys), (change.new_values, shape.quick_values),
                        (change.old_values, shape.quick_values)):
        for name, value in part.items():
            test = quick.get(name)
            if test is None or not test(value):
                _check_value(change, shape.types, shape.key_names, part is change.keys, name,
                             value)


def _check_value(change: SourceChange, types: dict[str, ColumnTypeInfo],
                 key_names: frozenset[str],
                 is_key: bool, name: str, value: Any) -> None:
    info = types.get(name)
    if info is None:
        raise InvalidArgument(f"column {name!r} of {change.table!r} is not in its column_types")
    if not is_key and name in key_names:
        raise InvalidArgument(f"key column {name!r} of {change.table!r} belongs in keys, not "
                              "in new or old values (CS-7)")
    try:
        validate_value(decode_value(value, info.type), info.type, name)
    except (InvalidArgument, ValueError, TypeError, KeyError, AttributeError) as error:
        raise InvalidArgument(f"value {value!r} of column {name!r} is not a "
                              f"{info.type.ddl()} in the record encoding: {error}") from None
