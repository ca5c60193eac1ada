"""Change streams into CDC tables: `apply_change_stream` runs the "cdcflow" streaming source
into one CdcTable per watched table.

Each mod becomes an UPSERT of the whole new row, or a DELETE, with the sequence number
(commit micros / record_sequence / mod_index), which orders every mod of a key. Change
records may carry partial new values (OLD_AND_NEW_VALUES and NEW_VALUES hold only the
written columns), so executors fold each key's mods in commit order onto the key's current
row, which they look up in the CDC table (the ranges holding those keys plus pending changes).
Batches are processed in order, so that row reflects every earlier batch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from cdcflow.model.records import ColumnTypeInfo
from cdcflow.model.sequence import ChangeSequenceNumber
from cdcflow.model.timestamps import to_micros
from cdcflow.model.types import decode_value
from cdcflow.spark.sink import FILES_SCHEMA, commit_pending_files, write_pending_file
from cdcflow.store.database import Database
from cdcflow.table import CdcTable
from cdcflow.table.arrow_types import arrow_type
from cdcflow.table.pending import applied_version, prepare

_FULL_ROW = ("NEW_ROW", "NEW_ROW_AND_OLD_VALUES")


def table_root(warehouse: str | Path, table: str) -> Path:
    return Path(warehouse) / table


def ensure_tables(database: Database, stream: str, warehouse: str | Path,
                  max_staleness: timedelta | None) -> dict[str, Path]:
    """A CdcTable per table the stream watches (keys + watched columns), created if missing."""
    definition = database.change_stream(stream)
    roots = {}
    for name in database.tables():
        if not definition.watches(name):
            continue
        schema = database.table_schema(name)
        watched = set(definition.watched_columns(schema)) | set(schema.primary_key)
        fields = [pa.field(c.name, arrow_type(c.type), not c.not_null)
                  for c in schema.columns if c.name in watched]
        root = table_root(warehouse, name)
        if not (root / "_cdcflow" / "table.json").exists():
            CdcTable.create(root, pa.schema(fields), list(schema.primary_key),
                            max_staleness=max_staleness)
        roots[name] = root
    return roots


def _python_row(types: dict[str, ColumnTypeInfo], values: dict[str, Any]) -> dict[str, Any]:
    row = {}
    for name, encoded in values.items():
        value = decode_value(encoded, types[name].type)
        if types[name].type.code == "JSON" and value is not None:
            value = json.dumps(value, sort_keys=True)
        row[name] = value
    return row


@dataclass(slots=True)
class FoldedKey:
    """One key's mods in a batch, in commit order, with the whole row after each mod (the
    deleted row for a DELETE) and the key's final row (None when deleted)."""

    table: str
    keys: dict[str, Any]
    mods: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    final: dict[str, Any] | None


def fold_mods(tables: dict[str, CdcTable | None], mods: list[dict[str, Any]]
              ) -> list[FoldedKey]:
    """Fold mods (rows of the "cdcflow" source) per key in commit order onto the key's row
    before the batch, looked up in its CDC table when there is one."""
    mods = sorted(mods, key=lambda m: (m["commit_timestamp"], m["record_sequence"],
                                       m["mod_index"]))
    by_table: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for mod in mods:
        by_table.setdefault(mod["table_name"], {}).setdefault(mod["keys"], []).append(mod)
    folded = []
    for table_name, keyed in by_table.items():
        table = tables.get(table_name)
        first_types = {c["name"]: ColumnTypeInfo.from_dict(c)
                       for c in json.loads(next(iter(keyed.values()))[0]["column_types"])}
        key_names = [n for n, info in first_types.items() if info.is_primary_key]
        needs_base = [
            tuple(_python_row(first_types, json.loads(k))[n] for n in key_names)
            for k, group in keyed.items()
            if group[0]["mod_type"] != "INSERT" and group[0]["value_capture_type"] not in _FULL_ROW
        ]
        base = table.lookup(needs_base) if table is not None else {}
        for group in keyed.values():
            types = {c["name"]: ColumnTypeInfo.from_dict(c)
                     for c in json.loads(group[-1]["column_types"])}
            columns = table.schema.names if table is not None else list(types)
            keys = _python_row(types, json.loads(group[0]["keys"]))
            state: dict[str, Any] | None = base.get(tuple(keys[n] for n in key_names))
            rows = []
            for mod in group:
                new = _python_row(types, json.loads(mod["new_values"]))
                empty = {c: None for c in columns}
                if mod["mod_type"] == "DELETE":
                    old = _python_row(types, json.loads(mod["old_values"]))
                    rows.append(empty | (state or {}) | old | keys)
                    state = None
                elif mod["mod_type"] == "INSERT" or mod["value_capture_type"] in _FULL_ROW:
                    state = empty | keys | new
                    rows.append(state)
                else:
                    state = empty | (state or {}) | keys | new
                    rows.append(state)
            folded.append(FoldedKey(table_name, keys, group, rows, state))
    return folded


def sequence_of(mod: dict[str, Any]) -> str:
    """The mod's _CHANGE_SEQUENCE_NUMBER: commit micros / record_sequence / mod_index."""
    stamp = mod["commit_timestamp"]
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return str(ChangeSequenceNumber.from_ints(
        to_micros(stamp), int(mod["record_sequence"]), int(mod["mod_index"])))


def pending_rows(table: CdcTable, folded: list[FoldedKey]) -> pa.Table:
    """UPSERT/DELETE rows of the final state of each folded key of one table."""
    columns = table.schema.names
    out = []
    for item in folded:
        sequence = sequence_of(item.mods[-1])
        if item.final is None:
            out.append(item.keys | {"_CHANGE_TYPE": "DELETE", "_CHANGE_SEQUENCE_NUMBER": sequence})
        else:
            out.append({c: item.final.get(c) for c in columns} | {
                "_CHANGE_TYPE": "UPSERT", "_CHANGE_SEQUENCE_NUMBER": sequence})
    names = list(dict.fromkeys(n for row in out for n in row))
    data = pa.Table.from_pydict({n: [r.get(n) for r in out] for n in names})
    return prepare(data, table.schema, table.primary_key)


def fold_partition(roots: dict[str, str], batches: Iterator[pa.RecordBatch],
                   batch_id: int) -> Iterator[pa.RecordBatch]:
    """Fold mods per key in commit order onto current rows; write pending files per table."""
    mods = [m for b in batches for m in b.to_pylist()]
    if not mods:
        return
    tables: dict[str, CdcTable | None] = {
        name: CdcTable.open(root) for name, root in roots.items()}
    folded = fold_mods(tables, [m for m in mods if m["table_name"] in roots])
    for name, table in tables.items():
        mine = [f for f in folded if f.table == name]
        if mine and table is not None:
            described = write_pending_file(roots[name], pending_rows(table, mine))
            yield pa.RecordBatch.from_pylist([described | {"mode": "cdc"}])


def change_stream_batch_writer(roots: dict[str, Path], app_id: str) -> Any:
    """The foreachBatch function of `apply_change_stream`."""
    resolved = {name: str(root.resolve()) for name, root in roots.items()}

    def write(frame: Any, batch_id: int) -> None:
        if all((applied_version(r, app_id) or -1) >= batch_id for r in resolved.values()):
            return
        arranged = frame.repartition("table_name", "keys").sortWithinPartitions(
            "commit_timestamp", "record_sequence", "mod_index")
        files = [r.asDict() for r in arranged.mapInArrow(
            lambda it: fold_partition(resolved, it, batch_id), FILES_SCHEMA).collect()]
        for root in resolved.values():
            mine = [f for f in files if f["table_root"] == root]
            commit_pending_files(root, mine, app_id, batch_id)

    return write


def apply_change_stream(
    spark: Any,
    database: str,
    stream: str,
    warehouse: str | Path,
    checkpoint: str | Path,
    starting_timestamp: str = "earliest",
    max_staleness: timedelta | None = None,
    trigger: dict[str, Any] | None = None,
    max_records_per_trigger: int | None = None,
) -> Any:
    """Start a streaming query that keeps one CDC table per watched table equal to the source.

    Tables live at `<warehouse>/<table>`. Returns the StreamingQuery. Apply jobs run by
    `CdcTable.apply()` or `start_background_apply()`; reads merge pending changes anyway.
    """
    db = Database.open(database, create=False)
    roots = ensure_tables(db, stream, warehouse, max_staleness)
    reader = (spark.readStream.format("cdcflow").option("database", database)
              .option("stream", stream).option("startingTimestamp", starting_timestamp))
    if max_records_per_trigger is not None:
        reader = reader.option("maxRecordsPerTrigger", max_records_per_trigger)
    app_id = f"change-stream:{Path(database).resolve()}:{stream}"
    writer = (reader.load().writeStream
              .foreachBatch(change_stream_batch_writer(roots, app_id))
              .option("checkpointLocation", str(checkpoint)))
    return writer.trigger(**(trigger or {"processingTime": "1 second"})).start()
