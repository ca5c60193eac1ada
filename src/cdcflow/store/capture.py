"""Turn the net row changes of one transaction into data change records (CS-7).

Pure: no I/O. One record per (stream, table, mod_type, partition) group, in order of first
appearance; `record_sequence` numbers the records of one stream's transaction from 0, so it
increases strictly across all of that transaction's partitions.

`build_records` and `encode_record` are the plain path: records as objects, then their log
bodies. A native commit takes the shortcut `cdcflow.store.native_entries`, tested to give the
same bodies.
"""

from __future__ import annotations

import bisect
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

import orjson

from cdcflow.model.memo import IdentityMemo
from cdcflow.model.records import ColumnTypeInfo, DataChangeRecord, Mod, format_sequence
from cdcflow.model.schema import ChangeStreamDef, TableSchema
from cdcflow.model.source import SourceMetadata
from cdcflow.model.timestamps import format_rfc3339
from cdcflow.store import record_types


@dataclass(slots=True)
class RowChange:
    """The net effect of one transaction on one row; rows are JSON-encoded column dicts."""

    schema: TableSchema
    encoded_key: str
    key_hash: int
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    written: set[str] = field(default_factory=set)

    @property
    def mod_type(self) -> str | None:
        if self.before is None:
            return None if self.after is None else "INSERT"
        return "DELETE" if self.after is None else "UPDATE"


@dataclass(frozen=True, slots=True)
class PartitionRanges:
    """Active partitions of one stream: sorted range starts and their tokens, for bisecting."""

    starts: tuple[int, ...]
    tokens: tuple[str, ...]

    def token_for(self, position: int) -> str:
        return self.tokens[bisect.bisect_right(self.starts, position) - 1]


@dataclass(frozen=True, slots=True)
class LogEntry:
    """A record ready for the log: stream, partition token, sequence number, record."""

    stream: str
    token: str
    sequence: int
    record: DataChangeRecord


def build_mod(change: RowChange, watched: tuple[str, ...], capture: str) -> Mod | None:
    """The mod of one row change for a stream, or None when the stream does not see it."""
    values = mod_values(change, watched, capture)
    return None if values is None else Mod(*values)


ModValues = tuple[dict[str, Any], dict[str, Any], dict[str, Any]]
"""A mod's keys, new values and old values."""


def mod_values(change: RowChange, watched: tuple[str, ...], capture: str) -> ModValues | None:
    """`build_mod`'s keys, new values and old values, or None."""
    mod_type = change.mod_type
    schema = change.schema
    row = change.after if change.after is not None else change.before
    assert row is not None and mod_type is not None
    keys = {name: row[name] for name in schema.primary_key}
    if mod_type == "INSERT":
        after = change.after or {}
        return keys, {c: after.get(c) for c in watched}, {}
    before = change.before or {}
    if mod_type == "DELETE":
        keeps_old = capture in ("OLD_AND_NEW_VALUES", "NEW_ROW_AND_OLD_VALUES")
        return keys, {}, {c: before.get(c) for c in watched} if keeps_old else {}
    after = change.after or {}
    modified = [c for c in watched if c in change.written]
    if not modified:
        return None
    match capture:
        case "OLD_AND_NEW_VALUES":
            return keys, {c: after.get(c) for c in modified}, {c: before.get(c) for c in modified}
        case "NEW_VALUES":
            return keys, {c: after.get(c) for c in modified}, {}
        case "NEW_ROW":
            return keys, {c: after.get(c) for c in watched}, {}
        case _:
            return keys, {c: after.get(c) for c in watched}, {c: before.get(c) for c in modified}


def column_types(schema: TableSchema, watched: tuple[str, ...]) -> tuple[ColumnTypeInfo, ...]:
    names = [*schema.primary_key, *watched]
    return tuple(
        ColumnTypeInfo(n, schema.column(n).type, n in schema.primary_key, schema.ordinal(n))
        for n in sorted(names, key=schema.ordinal)
    )


def build_records(
    changes: list[RowChange],
    streams: list[ChangeStreamDef],
    ranges_of: Callable[[str], PartitionRanges],
    commit_timestamp: datetime,
    transaction_id: str,
) -> list[LogEntry]:
    """Every stream's records for a transaction's row changes."""
    entries: list[LogEntry] = []
    for stream in sorted(streams, key=lambda s: s.name):
        groups: dict[tuple[str, str, str], list[Mod]] = {}
        watched_of: dict[str, tuple[str, ...] | None] = {}
        ranges = ranges_of(stream.name)
        for change in changes:
            table = change.schema.name
            if table not in watched_of:
                seen = stream.watches(table)
                watched_of[table] = stream.watched_columns(change.schema) if seen else None
            watched = watched_of[table]
            if watched is None or change.mod_type is None:
                continue
            mod = build_mod(change, watched, stream.value_capture_type)
            if mod is None:
                continue
            token = ranges.token_for(change.key_hash)
            groups.setdefault((table, change.mod_type, token), []).append(mod)
        entries.extend(_stream_records(stream, groups, changes, commit_timestamp, transaction_id))
    return entries


def _stream_records(
    stream: ChangeStreamDef,
    groups: dict[tuple[str, str, str], list[Mod]],
    changes: list[RowChange],
    commit_timestamp: datetime,
    transaction_id: str,
) -> list[LogEntry]:
    schemas = {c.schema.name: c.schema for c in changes}
    keys = list(groups)
    partitions = {token for _, _, token in keys}
    last_in_partition = {token: i for i, (_, _, token) in enumerate(keys)}
    entries = []
    for index, (table, mod_type, token) in enumerate(keys):
        schema = schemas[table]
        record = DataChangeRecord(
            commit_timestamp=commit_timestamp,
            record_sequence=format_sequence(index),
            server_transaction_id=transaction_id,
            is_last_record_in_transaction_in_partition=last_in_partition[token] == index,
            table_name=table,
            column_types=column_types(schema, stream.watched_columns(schema)),
            mods=tuple(groups[(table, mod_type, token)]),
            mod_type=mod_type,
            value_capture_type=stream.value_capture_type,
            number_of_records_in_transaction=len(keys),
            number_of_partitions_in_transaction=len(partitions),
        )
        entries.append(LogEntry(stream.name, token, index, record))
    return entries


class RecordHead(NamedTuple):
    """A data record but its mods: what `record_body` writes besides them."""

    table_name: str
    column_types: tuple[ColumnTypeInfo, ...]
    mod_type: str
    value_capture_type: str
    commit_timestamp: datetime
    server_transaction_id: str
    record_sequence: str
    last_in_partition: bool
    records: int
    partitions: int
    source: SourceMetadata | None


def encode_record(record: DataChangeRecord) -> str:
    """The log body of a record: its `to_dict()` JSON, with the column types and the source
    block (shared by many records) encoded once."""
    return record_body(RecordHead(
        record.table_name, record.column_types, record.mod_type, record.value_capture_type,
        record.commit_timestamp, record.server_transaction_id, record.record_sequence,
        record.is_last_record_in_transaction_in_partition,
        record.number_of_records_in_transaction, record.number_of_partitions_in_transaction,
        record.source), [m.to_dict() for m in record.mods])


def record_body(head: RecordHead, mods: list[dict[str, Any]]) -> str:
    """The log body of a record from its head and its mods as `Mod.to_dict` gives them: the
    one layout of `encode_record` and of records encoded without being built
    (`cdcflow.store.source_records.encoded_source_records`). Its column types come first,
    then what `record_rest` gives."""
    return record_types.joined(column_types_text(head.column_types), record_rest(head, mods))


def record_rest(head: RecordHead, mods: list[dict[str, Any]]) -> str:
    """`record_body` without its column types, as `_log` keeps it (`record_types.split`)."""
    body: dict[str, Any] = {
        "mods": mods,
        "commit_timestamp": _commit_text(head.commit_timestamp),
        "record_sequence": head.record_sequence,
        "server_transaction_id": head.server_transaction_id,
        "is_last_record_in_transaction_in_partition": head.last_in_partition,
        "table_name": head.table_name,
        "mod_type": head.mod_type,
        "value_capture_type": head.value_capture_type,
        "number_of_records_in_transaction": head.records,
        "number_of_partitions_in_transaction": head.partitions,
    }
    if head.source is not None:
        body["source"] = _source_json(head.source)
    return orjson.dumps(body).decode()


@functools.lru_cache(maxsize=1024)
def _column_types_json_text(column_types: tuple[ColumnTypeInfo, ...]) -> str:
    return json.dumps([c.to_dict() for c in column_types], separators=(",", ":"))


column_types_text = IdentityMemo(_column_types_json_text)
"""The JSON of column types, found by identity first (a capture source reuses one tuple per
relation, native commits one per stream and schema: `cdcflow.store.native_entries`); equal
tuples built again are found by value by the lru_cache. The same text object each time, so a
dict keyed by it finds it without hashing it again."""


@functools.lru_cache(maxsize=1024)
def _column_types_fragment(column_types: tuple[ColumnTypeInfo, ...]) -> orjson.Fragment:
    return orjson.Fragment(column_types_text(column_types))


column_types_json = IdentityMemo(_column_types_fragment)
"""`column_types_text` as a fragment orjson writes as it is."""



def _source_text(source: SourceMetadata) -> orjson.Fragment:
    return orjson.Fragment(orjson.dumps(source.to_dict()))


_source_json = IdentityMemo(_source_text, size=64)
"""The records of one source transaction share its block."""

_commit_text = IdentityMemo(format_rfc3339, size=64)
"""And its commit timestamp."""
