"""The log entries of a native commit, encoded straight from its row changes.

`build_records` then `encode_record` (cdcflow.store.capture) give a commit's records as
`DataChangeRecord` objects and then their log bodies. A commit of the embedded database needs
only the bodies, so this path builds each body's dict directly, with what depends only on the
stream and the table's schema (the watched columns, the column types' JSON) worked out once
per pair of objects. The bodies are the same text, in the same order, with the same partition
tokens and sequence numbers: tests/property/test_native_entries.py compares the two paths.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from cdcflow.model.memo import IdentityMemo
from cdcflow.model.records import format_sequence
from cdcflow.model.schema import ChangeStreamDef, TableSchema
from cdcflow.model.timestamps import format_rfc3339
from cdcflow.store.capture import (
    PartitionRanges,
    RowChange,
    column_types,
    column_types_json,
    mod_values,
)


class EncodedEntry(NamedTuple):
    """A data record ready for the log: stream, partition token, sequence, mods, JSON body."""

    stream: str
    token: str
    sequence: int
    mods: int
    body: str


@dataclass(frozen=True, slots=True)
class _TableView:
    """What a stream's records of one table share: its watched columns and column types."""

    watched: tuple[str, ...]
    column_types: orjson.Fragment


def _stream_views(stream: ChangeStreamDef) -> IdentityMemo[TableSchema, _TableView | None]:
    def view(schema: TableSchema) -> _TableView | None:
        if not stream.watches(schema.name):
            return None
        watched = stream.watched_columns(schema)
        return _TableView(watched, column_types_json(column_types(schema, watched)))

    return IdentityMemo(view, size=256)


_views = IdentityMemo(_stream_views, size=64)
"""A catalog keeps one object per stream and per table schema until DDL changes them."""

Group = tuple[str, str, str]
"""(table, mod_type, partition token): the changes that make one record."""


def native_entries(
    changes: list[RowChange],
    streams: list[ChangeStreamDef],
    ranges_of: Callable[[str], PartitionRanges],
    commit_micros: int,
    transaction_id: str,
) -> list[EncodedEntry]:
    """Every stream's encoded records for a transaction's row changes, as
    `encode_record` gives the records of `build_records`."""
    commit_text = format_rfc3339(commit_micros)
    entries: list[EncodedEntry] = []
    for stream in sorted(streams, key=lambda s: s.name):
        groups, types = _groups(stream, changes, ranges_of(stream.name))
        fixed = {"commit_timestamp": commit_text, "server_transaction_id": transaction_id,
                 "value_capture_type": stream.value_capture_type}
        entries.extend(_encoded(stream.name, groups, types, fixed))
    return entries


def _groups(stream: ChangeStreamDef, changes: list[RowChange], ranges: PartitionRanges
            ) -> tuple[dict[Group, list[dict[str, Any]]], dict[str, orjson.Fragment]]:
    """The stream's mods (as `Mod.to_dict` gives them) by record, in order of first
    appearance, and the column types of each table they are in."""
    views = _views(stream)
    capture = stream.value_capture_type
    groups: dict[Group, list[dict[str, Any]]] = {}
    types: dict[str, orjson.Fragment] = {}
    for change in changes:
        view = views(change.schema)
        mod_type = change.mod_type
        if view is None or mod_type is None:
            continue
        values = mod_values(change, view.watched, capture)
        if values is None:
            continue
        table = change.schema.name
        types[table] = view.column_types
        mod = {"keys": values[0], "new_values": values[1], "old_values": values[2]}
        groups.setdefault((table, mod_type, ranges.token_for(change.key_hash)), []).append(mod)
    return groups, types


def _encoded(stream: str, groups: dict[Group, list[dict[str, Any]]],
             types: dict[str, orjson.Fragment], fixed: dict[str, Any]) -> list[EncodedEntry]:
    keys = list(groups)
    last_in_partition = {token: i for i, (_, _, token) in enumerate(keys)}
    partitions = len(last_in_partition)
    entries = []
    for index, (table, mod_type, token) in enumerate(keys):
        mods = groups[(table, mod_type, token)]
        body = {
            "column_types": types[table],
            "mods": mods,
            "commit_timestamp": fixed["commit_timestamp"],
            "record_sequence": format_sequence(index),
            "server_transaction_id": fixed["server_transaction_id"],
            "is_last_record_in_transaction_in_partition": last_in_partition[token] == index,
            "table_name": table,
            "mod_type": mod_type,
            "value_capture_type": fixed["value_capture_type"],
            "number_of_records_in_transaction": len(keys),
            "number_of_partitions_in_transaction": partitions,
        }
        entries.append(EncodedEntry(stream, token, index, len(mods), orjson.dumps(body).decode()))
    return entries
