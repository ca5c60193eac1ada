"""Turn a committed source transaction into data change records (CS-7), per watching stream.

Pure: no I/O. A change is routed to the partition of its key hash, as native commits are (a
table without a primary key routes by the hash of its row). Changes keep the source's order:
consecutive changes of one table, mod type and shape in one partition share a record, and a
change that differs starts the next record, so ordering by (record_sequence, mod index)
replays every key's changes in source order, even when a transaction touches a key twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from cdcflow.model.changes import SourceChange, SourceTransaction
from cdcflow.model.records import DataChangeRecord, Mod, format_sequence
from cdcflow.model.schema import ChangeStreamDef, key_hash
from cdcflow.store.capture import LogEntry, PartitionRanges

MAX_MODS_PER_RECORD = 1_000
"""A long run of changes is cut into records of at most this many mods."""


def change_position(change: SourceChange) -> int:
    """The partition hash position of a change: its table and primary key (or whole row)."""
    if change.keys:
        ordered = [n.name for n in sorted(change.column_types, key=lambda c: c.ordinal_position)
                   if n.is_primary_key]
        identity = json.dumps([change.keys[name] for name in ordered], separators=(",", ":"))
    else:
        row = change.old_values if change.mod_type == "DELETE" else change.new_values
        identity = json.dumps(row, sort_keys=True, separators=(",", ":"))
    return key_hash(change.table, identity)


@dataclass(slots=True)
class _OpenRecord:
    token: str
    shape: tuple[object, ...]
    first: SourceChange
    mods: list[Mod] = field(default_factory=list)


def _runs(changes: list[SourceChange], ranges: PartitionRanges) -> list[_OpenRecord]:
    """Records in order of their first change; per partition, a new record whenever the
    table, mod type or shape differs from the partition's last record (or it is full)."""
    records: list[_OpenRecord] = []
    last: dict[str, _OpenRecord] = {}
    for change in changes:
        token = ranges.token_for(change_position(change))
        shape = (change.table, change.mod_type, change.value_capture_type, change.column_types)
        current = last.get(token)
        if current is None or current.shape != shape or len(current.mods) >= MAX_MODS_PER_RECORD:
            current = _OpenRecord(token, shape, change)
            records.append(current)
            last[token] = current
        current.mods.append(Mod(change.keys, change.new_values, change.old_values,
                                change.position))
    return records


def build_source_records(
    transaction: SourceTransaction,
    streams: list[ChangeStreamDef],
    ranges_of: Callable[[str], PartitionRanges],
    commit_timestamp: datetime,
    transaction_id: str,
) -> list[LogEntry]:
    """Every watching stream's records of one source transaction, at the log's commit time."""
    entries: list[LogEntry] = []
    for stream in sorted(streams, key=lambda s: s.name):
        changes = [c for c in transaction.changes if stream.watches(c.table)]
        if not changes:
            continue
        runs = _runs(changes, ranges_of(stream.name))
        last_in_partition = {run.token: i for i, run in enumerate(runs)}
        partitions = len(last_in_partition)
        for index, run in enumerate(runs):
            first = run.first
            record = DataChangeRecord(
                commit_timestamp=commit_timestamp,
                record_sequence=format_sequence(index),
                server_transaction_id=transaction_id,
                is_last_record_in_transaction_in_partition=last_in_partition[run.token] == index,
                table_name=first.table,
                column_types=first.column_types,
                mods=tuple(run.mods),
                mod_type=first.mod_type,
                value_capture_type=first.value_capture_type,
                number_of_records_in_transaction=len(runs),
                number_of_partitions_in_transaction=partitions,
                source=transaction.metadata,
            )
            entries.append(LogEntry(stream.name, run.token, index, record))
    return entries
