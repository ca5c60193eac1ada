"""Fold a batch's mods into whole rows, and the CDC-table changes that carry them. Pure.

Mods are rows of the "cdcflow" source (dicts of its columns: values as JSON text with
`column_types`, written by the source with orjson and read back with it). Change records may
carry partial new values (OLD_AND_NEW_VALUES and NEW_VALUES hold only the written columns; a
DELETE under NEW_VALUES or NEW_ROW holds only the key), so each key's mods are folded in log
order onto the key's row before the batch, which is looked up in the key's table (the ranges
holding those keys plus its pending changes). Batches are processed in order, so that row
reflects every earlier batch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC
from functools import lru_cache
from typing import Any

import orjson
import pyarrow as pa

from cdcflow.model.records import ColumnTypeInfo
from cdcflow.model.sequence import sequence_text
from cdcflow.model.timestamps import to_micros
from cdcflow.model.types import decode_value
from cdcflow.table.arrow_types import arrow_type
from cdcflow.table.cdc_table import CdcTable
from cdcflow.table.pending import as_arrow, prepare

_FULL_ROW = ("NEW_ROW", "NEW_ROW_AND_OLD_VALUES")


def python_row(types: dict[str, ColumnTypeInfo], values: dict[str, Any]) -> dict[str, Any]:
    """Python values of record-encoded values, JSON columns as canonical JSON text."""
    row = {}
    for name, encoded in values.items():
        value = decode_value(encoded, types[name].type)
        if types[name].type.code == "JSON" and value is not None:
            value = json.dumps(value, sort_keys=True)
        row[name] = value
    return row


@dataclass(slots=True)
class FoldedKey:
    """One key's mods in a batch, in log order, with the whole row after each mod (the
    deleted row for a DELETE) and the key's final row (None when deleted)."""

    table: str
    keys: dict[str, Any]
    mods: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    final: dict[str, Any] | None


LOG_ORDER = ("commit_timestamp", "record_sequence", "mod_index")
"""The columns that order the mods of one change log (and so of every key)."""


def log_order(mod: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(mod[name] for name in LOG_ORDER)


def _types_of(mod: dict[str, Any]) -> dict[str, ColumnTypeInfo]:
    """The column types of a mod (read-only: shared by every mod with the same text)."""
    return _parsed_types(mod["column_types"])


@lru_cache(maxsize=1024)
def _parsed_types(text: str) -> dict[str, ColumnTypeInfo]:
    return {c["name"]: ColumnTypeInfo.from_dict(c) for c in json.loads(text)}


def _needs_base(group: list[dict[str, Any]]) -> bool:
    """Whether a key's first mod in a batch lacks columns of the whole row: an UPDATE with
    only the written columns, unless it wrote them all, or a DELETE without the old values."""
    mod = group[0]
    capture = mod["value_capture_type"]
    match mod["mod_type"]:
        case "INSERT":
            return False
        case "UPDATE":
            return capture not in _FULL_ROW and not _writes_every_column(mod, group[-1])
        case _:
            return capture not in ("OLD_AND_NEW_VALUES", "NEW_ROW_AND_OLD_VALUES")


def _writes_every_column(mod: dict[str, Any], last: dict[str, Any]) -> bool:
    """An UPDATE whose keys and written columns are every column of the key's last mod's
    `column_types` (a writer of whole rows): `_fold_key` keeps only those columns of the row
    before the batch, and the UPDATE writes them all, so the folded rows are the same
    whatever that row was, and the table need not be read for it."""
    written: dict[str, Any] = orjson.loads(mod["new_values"])
    keys: dict[str, Any] = orjson.loads(mod["keys"])
    return _types_of(last).keys() <= written.keys() | keys.keys()


def _group_key(mod: dict[str, Any]) -> str:
    """Mods of one key fold together; a row of a table without a key stands alone."""
    if mod["keys"] != "{}":
        return str(mod["keys"])
    return f"{mod['server_transaction_id']}/{mod['record_sequence']}/{mod['mod_index']}"


def fold_mods(tables: dict[str, CdcTable | None], mods: list[dict[str, Any]],
              schemas: dict[str, pa.Schema] | None = None) -> list[FoldedKey]:
    """Fold mods per key in log order onto the key's row before the batch, looked up in its
    table when there is one. `schemas`: the tables' schemas when the caller has read them."""
    by_table: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for mod in sorted(mods, key=log_order):
        by_table.setdefault(mod["table_name"], {}).setdefault(_group_key(mod), []).append(mod)
    folded = []
    for table_name, keyed in by_table.items():
        table = tables.get(table_name)
        first_types = _types_of(next(iter(keyed.values()))[0])
        key_names = [n for n, info in first_types.items() if info.is_primary_key]
        def key_of(values: dict[str, Any], types: dict[str, ColumnTypeInfo] = first_types,
                   names: list[str] = key_names) -> tuple[Any, ...]:
            row = python_row(types, values)
            return tuple(row[n] for n in names)

        wanted = [key_of(orjson.loads(group[0]["keys"])) for group in keyed.values()
                  if _needs_base(group)]
        wanted += [key_of(moved) for group in keyed.values() for mod in group
                   if (moved := _moved_from(mod)) is not None]
        base = table.lookup(wanted) if table is not None and key_names else {}
        schema = (schemas or {}).get(table_name) or (table.schema if table is not None else None)
        context = _Context(key_names, base, schema.names if schema is not None else None)
        for group in keyed.values():  # in the order of their first mods
            folded.append(_fold_key(table_name, group, context))
    return folded


@dataclass(slots=True)
class _Context:
    """One table's fold: its key columns, the rows before the batch, its columns, and the
    rows deleted so far in this batch (by key), for rows whose key an UPDATE moved."""

    key_names: list[str]
    base: dict[tuple[Any, ...], dict[str, Any]]
    columns: list[str] | None
    deleted: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)

    def key(self, row: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(row[n] for n in self.key_names)


def _moved_from(mod: dict[str, Any]) -> dict[str, Any] | None:
    """The old keys of a row an UPDATE moved to a new key, when the INSERT at the new key
    lacks columns (values the source did not send again, as PostgreSQL's unchanged TOAST)."""
    if mod["mod_type"] != "INSERT" or mod["value_capture_type"] in _FULL_ROW:
        return None
    text = mod.get("source_metadata") or "{}"
    if '"moved_from"' not in text:  # most inserts: no need to parse the block
        return None
    moved: dict[str, Any] | None = orjson.loads(text).get("moved_from")
    return moved


def _fold_key(table: str, group: list[dict[str, Any]], context: _Context) -> FoldedKey:
    types = _types_of(group[-1])
    names = list(dict.fromkeys([*(context.columns or ()), *types]))
    keys = python_row(types, orjson.loads(group[0]["keys"]))
    state: dict[str, Any] | None = context.base.get(context.key(keys))
    rows = []
    for mod in group:
        own = _types_of(mod)  # a column added or dropped within the batch: each its own
        new = python_row(own, orjson.loads(mod["new_values"]))
        empty = {c: None for c in names}
        if mod["mod_type"] == "DELETE":
            old = python_row(own, orjson.loads(mod["old_values"]))
            rows.append(empty | (state or {}) | old | keys)
            context.deleted[context.key(keys)] = rows[-1]
            state = None
        elif (moved := _moved_from(mod)) is not None:
            old_key = context.key(python_row(types, moved))
            before = context.deleted.get(old_key) or context.base.get(old_key) or {}
            kept = {k: v for k, v in before.items() if k not in context.key_names}
            state = empty | _current(kept, types) | keys | new
            rows.append(state)
        elif mod["mod_type"] == "INSERT" or mod["value_capture_type"] in _FULL_ROW:
            state = empty | keys | new
            rows.append(state)
        else:
            state = empty | _current(state or {}, types) | keys | new
            rows.append(state)
    return FoldedKey(table, keys, group, rows, state)


def _current(row: dict[str, Any], types: dict[str, ColumnTypeInfo]) -> dict[str, Any]:
    """The values of the columns the change's table has now: a column the source dropped is
    NULL from its first change after the drop on (the table keeps the column)."""
    return {k: v for k, v in row.items() if k in types}


def sequence_of(mod: dict[str, Any]) -> str:
    """The mod's _CHANGE_SEQUENCE_NUMBER: commit micros / record_sequence / mod_index."""
    stamp = mod["commit_timestamp"]
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return sequence_text(to_micros(stamp), int(mod["record_sequence"]), int(mod["mod_index"]))


def added_fields(schema: pa.Schema, folded: list[FoldedKey]) -> list[pa.Field]:
    """Columns the mods carry that a table of `schema` lacks (the source added them)."""
    known = set(schema.names)
    fields: dict[str, pa.Field] = {}
    for item in folded:
        for info in _types_of(item.mods[-1]).values():
            if info.name not in known and info.name not in fields:
                fields[info.name] = pa.field(info.name, arrow_type(info.type), True)
    return list(fields.values())


def pending_rows(table: CdcTable, table_schema: pa.Schema, folded: list[FoldedKey],
                 ingest_ns: int, added: list[pa.Field] | None = None) -> pa.Table:
    """UPSERT/DELETE rows of the final state of each folded key of one table, in the table's
    schema (as read by the caller) plus the `added` columns."""
    schema = pa.schema([*table_schema, *(added or [])])
    columns = schema.names
    out = []
    for item in folded:
        sequence = sequence_of(item.mods[-1])
        if item.final is None:
            out.append(item.keys | {"_CHANGE_TYPE": "DELETE", "_CHANGE_SEQUENCE_NUMBER": sequence})
        else:
            out.append({c: item.final.get(c) for c in columns} | {
                "_CHANGE_TYPE": "UPSERT", "_CHANGE_SEQUENCE_NUMBER": sequence})
    return prepare(as_arrow(out, schema), schema, table.primary_key, ingest_ns)
