"""pgoutput row messages into `SourceChange`s, per relation. Pure.

A Relation message says how to read the rows of a table that follow it: column names, types
and which columns form the replica identity. An UPDATE that leaves a TOASTed value unchanged
does not send it: that column is left out of the change, which then counts as a partial new
row (NEW_VALUES), so its current value is kept downstream (under REPLICA IDENTITY FULL the
old row carries it, and the change is whole). An UPDATE that changes the key becomes a DELETE
of the old key and an INSERT of the new row; when that INSERT lacks unchanged values, its
position names the old key (`moved_from`) so they are taken from the row deleted there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cdcflow.capture.postgres.pgoutput import UNCHANGED, Delete, Insert, Update, Value, lsn_text
from cdcflow.errors import InvalidArgument
from cdcflow.model.changes import SourceChange
from cdcflow.model.records import ColumnTypeInfo


@dataclass(frozen=True, slots=True)
class RelationShape:
    """How to turn one table's tuples into changes."""

    object_name: str
    names: tuple[str, ...]
    converters: tuple[Callable[[str], Any], ...]
    """Text of a non-NULL value -> its record encoding, per column."""
    column_types: tuple[ColumnTypeInfo, ...]
    keys: tuple[str, ...]
    is_key: tuple[bool, ...] = field(init=False)
    keys_in_column_order: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_key", tuple(name in self.keys for name in self.names))
        object.__setattr__(self, "keys_in_column_order",
                           [n for n in self.names if n in self.keys] == list(self.keys))

    def split_row(self, row: tuple[Value, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The encoded key values and non-key values of the columns that were sent (an
        unchanged TOAST value is not)."""
        if len(row) != len(self.names):
            raise InvalidArgument(f"a row of {self.object_name!r} has {len(row)} columns, its "
                                  f"relation {len(self.names)}")
        keys: dict[str, Any] = {}
        values: dict[str, Any] = {}
        for name, convert, value, is_key in zip(self.names, self.converters, row,
                                                self.is_key, strict=True):
            if value is UNCHANGED:
                continue
            (keys if is_key else values)[name] = (convert(value) if isinstance(value, str)
                                                  else None)
        if len(keys) != len(self.keys):
            raise InvalidArgument(f"a row of {self.object_name!r} lacks a key column of "
                                  f"{self.keys}")
        if not self.keys_in_column_order:
            keys = {k: keys[k] for k in self.keys}
        return keys, values


def to_changes(shape: RelationShape, message: Insert | Update | Delete,
               lsn: int) -> list[SourceChange]:
    """The changes of one row message; `lsn` is the message's own position."""
    position = {"lsn": lsn_text(lsn)}

    def change(kind: str, keys: dict[str, Any], new: dict[str, Any], old: dict[str, Any],
               capture: str) -> SourceChange:
        return SourceChange(shape.object_name, kind, keys, new, old, shape.column_types,
                            capture, position)

    match message:
        case Insert(new=row):
            keys, new = shape.split_row(row)
            return [change("INSERT", keys, new, {}, "NEW_ROW")]
        case Update(old_kind=old_kind, old=old_row, new=row):
            if old_kind == "O" and old_row is not None:  # FULL: unchanged values are in it
                row = tuple(o if n is UNCHANGED else n for n, o in zip(row, old_row,
                                                                       strict=True))
            keys, new = shape.split_row(row)
            capture = "NEW_VALUES" if len(keys) + len(new) < len(shape.names) else "NEW_ROW"
            if old_row is not None and shape.keys:
                old_keys, _ = shape.split_row(old_row)
                if old_keys != keys:  # the key moved: the old row goes, the new one comes
                    moved = SourceChange(shape.object_name, "INSERT", keys, new, {},
                                         shape.column_types, capture,
                                         position | {"moved_from": old_keys, "part": 1})
                    return [change("DELETE", old_keys, {}, {}, "NEW_ROW"), moved]
            return [change("UPDATE", keys, new, {}, capture)]
        case Delete(old_kind=kind, old=row):
            keys, old = shape.split_row(row)
            if kind == "O":  # REPLICA IDENTITY FULL: the whole old row
                return [change("DELETE", keys, {}, old, "NEW_ROW_AND_OLD_VALUES")]
            return [change("DELETE", keys, {}, {}, "NEW_ROW")]
    raise AssertionError(f"not a row message: {message!r}")
