"""Pending changes: a Delta table at `<root>/_cdcflow/pending` that connections append to.

Each append is one Delta commit carrying an app-transaction id (app, version), so a retried
append or a replayed streaming batch is skipped (exactly once). Rows carry their change type,
sequence number (and its sort key) and their ingestion order (append time, row index).
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction

from cdcflow.clock import Clock
from cdcflow.errors import InvalidArgument, Unavailable
from cdcflow.model.sequence import RULE, sort_key_of
from cdcflow.model.timestamps import to_micros
from cdcflow.table.append_checks import (
    check_exact,
    check_keys,
    check_names,
    check_text,
    checked_version,
    key_values,
)
from cdcflow.table.delta_log import EXPIRED_LOG_CLEANUP

CHANGE_TYPE = "_CHANGE_TYPE"
SEQUENCE = "_CHANGE_SEQUENCE_NUMBER"
SEQ_KEY = "_cdcflow_seq_key"
INGEST = "_cdcflow_ingest"
ROW = "_cdcflow_row"
INVALID_CHANGE_TYPE = "The given value is not a valid CHANGE_TYPE"


def pending_path(root: str | Path) -> str:
    return str(Path(root) / "_cdcflow" / "pending")


def pending_schema(schema: pa.Schema) -> pa.Schema:
    extra = [pa.field(CHANGE_TYPE, pa.string()), pa.field(SEQUENCE, pa.string()),
             pa.field(SEQ_KEY, pa.string()), pa.field(INGEST, pa.int64()),
             pa.field(ROW, pa.int64())]
    return pa.schema([f.with_nullable(True) for f in schema] + extra)


PENDING_LOG_PROPERTIES = {"delta.logRetentionDuration": "interval 2 minutes",
                          EXPIRED_LOG_CLEANUP: "true"}
"""A pending table takes a commit per micro-batch (several a second), and each commit lists
the log: without cleanup a commit costs 8 ms at 300 log entries and 17 ms at 1,200, and grows.
Nobody reads a pending table's history (its rows go to the table; the apply reads the newest
version), so log entries older than two minutes and than the last checkpoint are removed."""


def create_pending(root: str | Path, schema: pa.Schema) -> None:
    DeltaTable.create(pending_path(root), pending_schema(schema),
                      configuration=PENDING_LOG_PROPERTIES)


def keep_pending_log_short(table: DeltaTable) -> None:
    """Give a pending table made before PENDING_LOG_PROPERTIES existed its log cleanup."""
    found = table.metadata().configuration
    if any(found.get(key) != value for key, value in PENDING_LOG_PROPERTIES.items()):
        table.alter.set_table_properties(PENDING_LOG_PROPERTIES)


def change_mode(types: list[Any]) -> str:
    """"cdc" when every row says UPSERT or DELETE, "plain" when every row says INSERT or
    nothing; mixing the two, or any other value, is the AP-3 error."""
    cdc = {"UPSERT", "DELETE"}
    plain = {"INSERT", None}
    found = set(types)
    bad = [v for v in found if v not in cdc | plain]
    if bad:
        raise InvalidArgument(f"{INVALID_CHANGE_TYPE}: {bad[0]!r} (use UPSERT or DELETE)")
    if found & cdc and found & plain:
        mixed = next(v for v in types if v in plain)
        raise InvalidArgument(
            f"{INVALID_CHANGE_TYPE}: {mixed!r} mixed with UPSERT/DELETE rows on one connection"
        )
    return "cdc" if found & cdc else "plain"


_INGEST_LOCK = threading.Lock()
_LAST_INGEST = [0]


def ingest_stamp(clock: Clock) -> int:
    """The ingestion time of an append in nanoseconds: the clock's now, strictly increasing
    within this process, so two appends never tie on it."""
    now = to_micros(clock.now()) * 1000
    with _INGEST_LOCK:
        _LAST_INGEST[0] = max(now, _LAST_INGEST[0] + 1)
        return _LAST_INGEST[0]


_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError,
                 OverflowError, TypeError, ValueError)


def _first_misfit(values: list[Any] | pa.ChunkedArray | pa.Array,
                  field: pa.Field) -> tuple[int, Any, str]:
    """The first value that does not convert to the field's type, and why."""
    for index in range(len(values)):
        try:
            if isinstance(values, list):
                pa.array(values[index:index + 1], type=field.type)
            else:
                values.slice(index, 1).cast(field.type)
        except _ARROW_ERRORS as error:
            value = values[index] if isinstance(values, list) else values[index].as_py()
            return index, value, str(error).splitlines()[0]
    raise AssertionError("a column that fails to convert has a value that fails")


def _misfit_error(values: list[Any] | pa.ChunkedArray | pa.Array,
                  field: pa.Field) -> InvalidArgument:
    row, value, why = _first_misfit(values, field)
    return InvalidArgument(
        f"row {row}: value {value!r} does not fit column {field.name!r} of type {field.type} "
        f"({why}); nothing of this append was written"
    )


def fit_column(column: pa.ChunkedArray | pa.Array, field: pa.Field) -> pa.Array:
    """An appended column as the field's type; a value that does not fit is InvalidArgument
    naming its row and the column."""
    try:
        return column.cast(field.type)
    except _ARROW_ERRORS:
        raise _misfit_error(column, field) from None


def as_arrow(rows: Any, schema: pa.Schema) -> pa.Table:
    """An append as an Arrow table: a pyarrow Table as is, a list of dicts or a pandas
    DataFrame converted with the table's column types, so a bad value names its row."""
    if isinstance(rows, pa.Table):
        check_names(rows.column_names)
        return rows
    if isinstance(rows, list):
        if not all(isinstance(r, dict) for r in rows):
            raise InvalidArgument("append takes a pyarrow Table, a list of dicts or a DataFrame")
        names = list(dict.fromkeys(name for row in rows for name in row))
        check_names(names)
        return pa.Table.from_pydict({n: _python_column([r.get(n) for r in rows], n, schema)
                                     for n in names})
    if hasattr(rows, "to_dict") and hasattr(rows, "columns"):
        check_names(list(rows.columns))
        try:
            return pa.Table.from_pandas(rows, preserve_index=False)
        except _ARROW_ERRORS:  # row by row, to name the bad row; NaN is missing, as above
            records = rows.astype(object).where(rows.notna(), None).to_dict("records")
            return as_arrow(records, schema)
    raise InvalidArgument(f"append cannot take {type(rows).__name__}; pass a pyarrow Table, "
                          "a list of dicts or a pandas DataFrame")


def _python_column(values: list[Any], name: str, schema: pa.Schema) -> pa.Array:
    if name in (CHANGE_TYPE, SEQUENCE):
        check_text(values, name)
    if name in schema.names or name in (CHANGE_TYPE, SEQUENCE):
        field = schema.field(name) if name in schema.names else pa.field(name, pa.string())
        try:
            array = pa.array(values, type=field.type)
        except _ARROW_ERRORS:
            raise _misfit_error(values, field) from None
        check_exact(values, field)
        return array
    try:
        return pa.array(values)
    except _ARROW_ERRORS:
        raise InvalidArgument(f"column {name!r} is not in the table; columns: "
                              f"{schema.names}") from None


def _sequence_keys(sequences: list[Any]) -> list[str]:
    keys = []
    for index, text in enumerate(sequences):
        try:
            keys.append(sort_key_of(text))
        except InvalidArgument:
            raise InvalidArgument(
                f"row {index}: _CHANGE_SEQUENCE_NUMBER {text!r} is malformed: {RULE}"
            ) from None
    return keys


def _fitted(data: pa.Table, field: pa.Field, primary_key: tuple[str, ...]) -> Any:
    if field.name not in data.column_names:
        return pa.nulls(data.num_rows, field.type)
    column = fit_column(data.column(field.name), field)
    return key_values(column, field) if field.name in primary_key else column


def prepare(data: pa.Table, schema: pa.Schema, primary_key: tuple[str, ...],
            ingest_ns: int) -> pa.Table:
    """Validate an append and shape it as pending rows, ingested at `ingest_ns`. Omitted
    columns become NULL (an UPSERT writes the whole row); INSERT and untyped rows count as
    UPSERTs."""
    check_names(data.column_names)
    unknown = [n for n in data.column_names if n not in schema.names and n not in (
        CHANGE_TYPE, SEQUENCE)]
    if unknown:
        raise InvalidArgument(f"columns {unknown} are not in the table; columns: {schema.names}")
    rows = data.num_rows
    types = data.column(CHANGE_TYPE).to_pylist() if CHANGE_TYPE in data.column_names else (
        [None] * rows)
    change_mode(types)
    check_keys(data, primary_key)
    sequences = (data.column(SEQUENCE).to_pylist() if SEQUENCE in data.column_names
                 else [None] * rows)
    seq_keys = _sequence_keys(sequences)
    columns = [_fitted(data, f, primary_key) for f in schema]
    kinds = ["DELETE" if t == "DELETE" else "UPSERT" for t in types]
    columns += [pa.array(kinds, pa.string()), pa.array(sequences, pa.string()),
                pa.array(seq_keys, pa.string()), pa.array([ingest_ns] * rows, pa.int64()),
                pa.array(range(rows), pa.int64())]
    return pa.Table.from_arrays(columns, schema=pending_schema(schema))


def append(root: str | Path, rows: pa.Table, app_id: str | None, version: int | None,
           clock: Clock) -> bool:
    """Commit prepared rows; False (nothing written) when (app_id, version) is already in."""
    path = pending_path(root)
    if app_id is not None:
        version = checked_version(app_id, version)
        current = DeltaTable(path).transaction_version(app_id)
        if current is not None and current >= version:
            return False
    elif rows.num_rows == 0:
        return True
    order = pa.schema(DeltaTable(path).schema().to_arrow()).names  # added columns come last
    files = [write_pending_file(str(root), rows.select(order))] if rows.num_rows else []
    return commit_pending_files(str(root), files, app_id, version, clock)

COMMIT_ATTEMPTS = 20
"""How often a commit of pending files is tried against applies that commit first."""


class PendingLogs:
    """The pending Delta tables one streaming query commits to, each loaded once and then
    brought up to date with the commits since (a fresh load reads every commit since the
    last checkpoint: tens of ms, on every batch). For one query's lifetime only: a table
    deleted and created again under the same root would not be noticed."""

    def __init__(self) -> None:
        self._tables: dict[str, DeltaTable] = {}
        self._lock = threading.Lock()
        self._last_batch: int | None = None

    def ran(self, batch_id: int) -> None:
        """Note that this query has written batch `batch_id` in full."""
        self._last_batch = batch_id

    def ran_before(self, batch_id: int) -> bool:
        """True when this query has written a batch before `batch_id`: then `batch_id` is new
        (a query runs its batches in order, and only a new query replays one), and whether a
        table holds it need not be asked of Delta. A table without changes in a batch gets no
        commit, so its (app_id, version) says nothing of later batches."""
        return self._last_batch is not None and batch_id > self._last_batch

    def fresh(self, root: str | Path, refresh: bool = True) -> DeltaTable:
        """The table at its newest version (`refresh=False`: as last loaded; a commit on a
        stale version is checked against the commits since and retried on a conflict)."""
        path = pending_path(root)
        with self._lock:
            table = self._tables.get(path)
            if table is None:
                table = self._tables[path] = DeltaTable(path)
                keep_pending_log_short(table)
            elif refresh:
                try:
                    table.update_incremental()
                except Exception:  # its next log entries were cleaned up: load it anew
                    table = self._tables[path] = DeltaTable(path)
            return table


def _pending_table(root: str | Path, logs: PendingLogs | None, refresh: bool = True
                   ) -> DeltaTable:
    return DeltaTable(pending_path(root)) if logs is None else logs.fresh(root, refresh)


def applied_version(root: str | Path, app_id: str, logs: PendingLogs | None = None
                    ) -> int | None:
    return _pending_table(root, logs).transaction_version(app_id)



def write_pending_file(root: str, prepared: pa.Table) -> dict[str, Any]:
    """Write prepared pending rows as one Parquet file in the table's pending folder (not yet
    part of the table: `commit_pending_files` adds it)."""
    name = f"part-{uuid.uuid4().hex}.parquet"
    folder = Path(pending_path(root))
    temporary = folder / f".{name}.tmp"
    pq.write_table(prepared, temporary)
    os.replace(temporary, folder / name)
    return {"table_root": root, "path": name, "size": (folder / name).stat().st_size,
            "rows": prepared.num_rows}


def _check_written(root: str, files: list[dict[str, Any]]) -> None:
    """Every file to commit is there, and newer than any vacuum's cutoff from now on (its
    time is set to now): one a vacuum deleted, its batch having taken longer than the
    table's file retention (`cdcflow.table.vacuum`), would leave a commit that no read can
    follow. Unavailable: the batch is to be run again, and writes its files anew."""
    folder = Path(pending_path(root))
    for described in files:
        try:
            os.utime(folder / described["path"])
        except FileNotFoundError:
            raise Unavailable(
                f"pending file {described['path']} of {root} is gone before its commit: a "
                "batch must commit within the table's file_retention; it is to be run again"
            ) from None


def commit_pending_files(root: str, files: list[dict[str, Any]], app_id: str | None,
                         batch_id: int | None, clock: Clock, logs: PendingLogs | None = None
                         ) -> bool:
    """Register written files in one Delta commit with (app_id, batch_id); False if the batch
    was committed before (the files of this attempt stay orphans, never read).

    An apply that removes applied pending files may commit first: Delta then refuses this
    commit ("a concurrent transaction deleted data this operation read"), although adding new
    files reads nothing the apply removed. The commit is tried again on the new version, after
    the same check of (app_id, batch_id)."""
    _check_written(root, files)
    transactions = ([Transaction(app_id, batch_id)]
                    if app_id is not None and batch_id is not None else None)
    now_ms = to_micros(clock.now()) // 1000
    actions: list[AddAction | RemoveAction] = [
        AddAction(f["path"], int(f["size"]), {}, now_ms, True,
                  json.dumps({"numRecords": int(f["rows"])})) for f in files]
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        table = _pending_table(root, logs, refresh=attempt > 1)  # the caller just loaded it
        if app_id is not None and batch_id is not None:
            current = table.transaction_version(app_id)
            if current is not None and current >= batch_id:
                return False
        try:
            table.create_write_transaction(
                actions, mode="append", schema=table.schema(),
                commit_properties=CommitProperties(app_transactions=transactions),
            )
            if logs is not None:  # the loaded table does not move past its own commit; left
                logs.fresh(root)  # behind, the next batch's (app_id) would be refused first
            return True
        except CommitFailedError:
            if attempt == COMMIT_ATTEMPTS:
                raise
    raise AssertionError("unreachable")
