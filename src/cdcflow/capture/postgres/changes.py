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
from dataclasses import dataclass
from typing import Any

from cdcflow.capture.postgres.pgoutput import UNCHANGED, Delete, Insert, Update, Value, lsn_text
from cdcflow.model.changes import SourceChange
from cdcflow.model.records import ColumnTypeInfo


@dataclass(frozen=True, slots=True)
class RelationShape:
    """How to turn one table's tuples into changes."""

    object_name: str
    names: tuple[str, ...]
    converters: tuple[Callable[[str | None], Any], ...]
    column_types: tuple[ColumnTypeInfo, ...]
    keys: tuple[str, ...]

    def values(self, row: tuple[Value, ...]) -> dict[str, Any]:
        """Encoded values of the columns that were sent (unchanged TOAST values are not)."""
        return {name: convert(None if value is None else str(value))
                for name, convert, value in zip(self.names, self.converters, row, strict=True)
                if value is not UNCHANGED}

    def split(self, values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        keys = {k: values[k] for k in self.keys}
        return keys, {k: v for k, v in values.items() if k not in self.keys}


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
            keys, new = shape.split(shape.values(row))
            return [change("INSERT", keys, new, {}, "NEW_ROW")]
        case Update(old_kind=old_kind, old=old_row, new=row):
            if old_kind == "O" and old_row is not None:  # FULL: unchanged values are in it
                row = tuple(o if n is UNCHANGED else n for n, o in zip(row, old_row,
                                                                       strict=True))
            values = shape.values(row)
            keys, new = shape.split(values)
            capture = "NEW_VALUES" if len(values) < len(shape.names) else "NEW_ROW"
            if old_row is not None and shape.keys:
                old_keys, _ = shape.split(shape.values(old_row))
                if old_keys != keys:  # the key moved: the old row goes, the new one comes
                    moved = SourceChange(shape.object_name, "INSERT", keys, new, {},
                                         shape.column_types, capture,
                                         position | {"moved_from": old_keys, "part": 1})
                    return [change("DELETE", old_keys, {}, {}, "NEW_ROW"), moved]
            return [change("UPDATE", keys, new, {}, capture)]
        case Delete(old_kind=kind, old=row):
            keys, old = shape.split(shape.values(row))
            if kind == "O":  # REPLICA IDENTITY FULL: the whole old row
                return [change("DELETE", keys, {}, old, "NEW_ROW_AND_OLD_VALUES")]
            return [change("DELETE", keys, {}, {}, "NEW_ROW")]
    raise AssertionError(f"not a row message: {message!r}")
