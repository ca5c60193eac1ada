"""Turn a committed source transaction into data change records (CS-7), per watching stream.

Pure: no I/O. A change is routed to the partition of its key hash, as native commits are (a
table without a primary key routes by the hash of its row). Changes keep the source's order:
consecutive changes of one table, mod type and shape in one partition share a record, and a
change that differs starts the next record, so ordering by (record_sequence, mod index)
replays every key's changes in source order, even when a transaction touches a key twice.

It streams: the changes are read twice (once to count the records each record must name,
once to build them), and at most one record per partition is open at a time, so a
transaction of millions of changes, read from disk, takes little memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import orjson

from cdcflow.model.changes import SourceChange
from cdcflow.model.memo import IdentityMemo
from cdcflow.model.records import ColumnTypeInfo, DataChangeRecord, Mod, format_sequence
from cdcflow.model.schema import ChangeStreamDef, key_hash
from cdcflow.model.source import SourceMetadata
from cdcflow.model.timestamps import from_micros
from cdcflow.store.capture import (
    LogEntry,
    PartitionRanges,
    RecordHead,
    column_types_text,
    record_rest,
)
from cdcflow.store.log import DataRow

MAX_MODS_PER_RECORD = 1_000
"""A long run of changes is cut into records of at most this many mods."""

Changes = Callable[[], Iterable[SourceChange]]
"""A transaction's changes in source order; may be called more than once."""


def change_position(change: SourceChange) -> int:
    """The partition hash position of a change: its table and primary key (or whole row)."""
    if change.keys:
        values = [change.keys[name] for name in _key_order(change.column_types)]
        identity = orjson.dumps(values).decode()
    else:
        row = change.old_values if change.mod_type == "DELETE" else change.new_values
        identity = orjson.dumps(row, option=orjson.OPT_SORT_KEYS).decode()
    return key_hash(change.table, identity)


def _primary_key_order(column_types: tuple[ColumnTypeInfo, ...]) -> tuple[str, ...]:
    return tuple(c.name for c in sorted(column_types, key=lambda c: c.ordinal_position)
                 if c.is_primary_key)


_key_order = IdentityMemo(_primary_key_order, size=256)


@dataclass(slots=True)
class _Run:
    index: int
    token: str
    shape: tuple[object, ...]
    first: SourceChange
    mods: list[Any]
    """`Mod`s, or the dicts `Mod.to_dict` would give (`_Runs`' mode "dicts")."""
    size: int = 0


def _mod_dict(change: SourceChange) -> dict[str, Any]:
    """`Mod.to_dict()` of the change's mod, without the Mod."""
    mod = {"keys": change.keys, "new_values": change.new_values,
           "old_values": change.old_values}
    if change.position:
        mod["position"] = change.position
    return mod


class _Runs:
    """Cuts one stream's changes into records: per partition a new record whenever the
    table, mod type or shape differs from the partition's open record, or it is full.
    `mods` says what a run keeps of each change: "count" nothing (the records are only
    counted, with each partition's last), "objects" a `Mod`, "dicts" the dict of its JSON
    (`Mod.to_dict()`)."""

    def __init__(self, ranges: PartitionRanges, mods: Literal["count", "objects", "dicts"]
                 ) -> None:
        self.ranges, self.mods = ranges, mods
        self.open: dict[str, _Run] = {}
        self.count = 0
        self.last_in_partition: dict[str, int] = {}

    def add(self, change: SourceChange, position: int) -> _Run | None:
        """Take a change at its hash `position`; return the record it closed, if any."""
        token = self.ranges.token_for(position)
        shape = (change.table, change.mod_type, change.value_capture_type, change.column_types)
        current = self.open.get(token)
        closed = None
        if current is None or current.shape != shape or current.size >= MAX_MODS_PER_RECORD:
            closed = current
            current = _Run(self.count, token, shape, change, [])
            self.open[token] = current
            self.last_in_partition[token] = self.count
            self.count += 1
        current.size += 1
        if self.mods == "dicts":
            current.mods.append(_mod_dict(change))
        elif self.mods == "objects":
            current.mods.append(Mod(change.keys, change.new_values, change.old_values,
                                    change.position))
        return closed

    def finish(self) -> list[_Run]:
        closed, self.open = list(self.open.values()), {}
        return closed


def source_records(
    metadata: SourceMetadata,
    changes: Changes,
    streams: list[ChangeStreamDef],
    ranges_of: Callable[[str], PartitionRanges],
    commit_timestamp: datetime,
    transaction_id: str,
    in_memory: bool = False,
) -> Iterator[LogEntry]:
    """Every watching stream's records of one source transaction, at the log's commit time
    (in no particular order of records). `in_memory`: the changes are held in memory, so
    each one's hash position is worked out once and kept (else twice per stream). A batch of
    transactions in memory is appended through `encoded_source_records`; `in_memory` stays
    as the reference its property test compares with."""
    positioned = _positioned(changes, in_memory)
    for stream in sorted(streams, key=lambda s: s.name):
        ranges = ranges_of(stream.name)
        mine = _watched_by(stream, positioned)
        if in_memory:  # one pass: the records are kept until the counts are known
            runs, made = _in_one_pass(ranges, mine(), "objects")
            for run in made:
                yield _entry(stream.name, run, runs, metadata, commit_timestamp,
                             transaction_id)
            continue
        plan = _Runs(ranges, "count")
        for change, position in mine():
            plan.add(change, position)
        if plan.count == 0:
            continue
        runs = _Runs(ranges, "objects")
        for change, position in mine():
            if (closed := runs.add(change, position)) is not None:
                yield _entry(stream.name, closed, plan, metadata, commit_timestamp,
                             transaction_id)
        for run in runs.finish():
            yield _entry(stream.name, run, plan, metadata, commit_timestamp, transaction_id)


def encoded_source_records(
    metadata: SourceMetadata,
    changes: Changes,
    streams: list[ChangeStreamDef],
    ranges_of: Callable[[str], PartitionRanges],
    commit_micros: int,
    transaction_id: str,
) -> Iterator[DataRow]:
    """The log rows of `source_records(..., in_memory=True)`'s records at `commit_micros`,
    encoded as `encode_record` encodes them, without building a record or a mod: the same
    records in the same order with the same bodies (tests/property/test_fast_paths.py), each
    with its column types apart, as `_log` keeps them (`cdcflow.store.record_types`)."""
    positioned = _positioned(changes, True)
    commit_timestamp = from_micros(commit_micros)
    for stream in sorted(streams, key=lambda s: s.name):
        runs, made = _in_one_pass(ranges_of(stream.name), _watched_by(stream, positioned)(),
                                  "dicts")
        for run in made:
            first = run.first
            head = RecordHead(
                first.table, first.column_types, first.mod_type, first.value_capture_type,
                commit_timestamp, transaction_id, format_sequence(run.index),
                last_in_partition=runs.last_in_partition[run.token] == run.index,
                records=runs.count, partitions=len(runs.last_in_partition), source=metadata)
            yield DataRow(stream.name, run.token, commit_micros, run.index, len(run.mods),
                          record_rest(head, run.mods), column_types_text(first.column_types))


def _in_one_pass(ranges: PartitionRanges, positioned: Iterable[tuple[SourceChange, int]],
                 mods: Literal["objects", "dicts"]) -> tuple[_Runs, list[_Run]]:
    """Every record of changes held in memory, in the order they close, and the runs that
    counted them."""
    runs = _Runs(ranges, mods)
    closed = [run for change, position in positioned
              if (run := runs.add(change, position)) is not None]
    return runs, [*closed, *runs.finish()]


def _watched_by(stream: ChangeStreamDef, positioned: Callable[[], Iterable[tuple[SourceChange,
                int]]]) -> Callable[[], Iterator[tuple[SourceChange, int]]]:
    """The positioned changes of the tables `stream` watches, as often as asked."""
    watched: dict[str, bool] = {}

    def watches(table: str) -> bool:
        seen = watched.get(table)
        if seen is None:
            seen = watched[table] = stream.watches(table)
        return seen

    return lambda: ((c, p) for c, p in positioned() if watches(c.table))


def _positioned(changes: Changes, in_memory: bool
                ) -> Callable[[], Iterable[tuple[SourceChange, int]]]:
    """The changes with their hash positions, as often as asked."""
    if in_memory:
        kept = [(change, change_position(change)) for change in changes()]
        return lambda: kept
    return lambda: ((change, change_position(change)) for change in changes())


def _entry(stream: str, run: _Run, counted: _Runs, metadata: SourceMetadata,
           commit_timestamp: datetime, transaction_id: str) -> LogEntry:
    """The record of one run; `counted` is the plan that counted the transaction's records."""
    first = run.first
    return LogEntry(stream, run.token, run.index, DataChangeRecord(
        commit_timestamp=commit_timestamp,
        record_sequence=format_sequence(run.index),
        server_transaction_id=transaction_id,
        is_last_record_in_transaction_in_partition=(
            counted.last_in_partition[run.token] == run.index),
        table_name=first.table,
        column_types=first.column_types,
        mods=tuple(run.mods),
        mod_type=first.mod_type,
        value_capture_type=first.value_capture_type,
        number_of_records_in_transaction=counted.count,
        number_of_partitions_in_transaction=len(counted.last_in_partition),
        source=metadata,
    ))
