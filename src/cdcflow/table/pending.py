"""Pending changes: a Delta table at `<root>/_cdcflow/pending` that connections append to.

Each append is one Delta commit carrying an app-transaction id (app, version), so a retried
append or a replayed streaming batch is skipped (exactly once). Rows carry their change type,
sequence number (and its sort key) and their ingestion order (append time, row index).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import CommitProperties, Transaction

from cdcflow.errors import InvalidArgument
from cdcflow.model.sequence import RULE, sort_key_of

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


def create_pending(root: str | Path, schema: pa.Schema) -> None:
    DeltaTable.create(pending_path(root), pending_schema(schema))


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


def prepare(data: pa.Table, schema: pa.Schema, primary_key: tuple[str, ...]) -> pa.Table:
    """Validate an append and shape it as pending rows. Omitted columns become NULL (an
    UPSERT writes the whole row); INSERT and untyped rows count as UPSERTs."""
    unknown = [n for n in data.column_names if n not in schema.names and n not in (
        CHANGE_TYPE, SEQUENCE)]
    if unknown:
        raise InvalidArgument(f"columns {unknown} are not in the table; columns: {schema.names}")
    rows = data.num_rows
    types = data.column(CHANGE_TYPE).to_pylist() if CHANGE_TYPE in data.column_names else (
        [None] * rows)
    change_mode(types)
    for key in primary_key:
        if key not in data.column_names or data.column(key).null_count:
            bad = next(i for i in range(rows)) if key not in data.column_names else next(
                i for i, v in enumerate(data.column(key).to_pylist()) if v is None)
            raise InvalidArgument(
                f"row {bad}: primary key column {key!r} is NULL or missing; key columns can't "
                "be NULL (AP-2)"
            )
    sequences = (data.column(SEQUENCE).to_pylist() if SEQUENCE in data.column_names
                 else [None] * rows)
    seq_keys = []
    for index, text in enumerate(sequences):
        try:
            seq_keys.append(sort_key_of(text))
        except InvalidArgument:
            raise InvalidArgument(
                f"row {index}: _CHANGE_SEQUENCE_NUMBER {text!r} is malformed: {RULE}"
            ) from None
    columns = []
    for field in schema:
        if field.name in data.column_names:
            try:
                columns.append(data.column(field.name).cast(field.type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
                raise InvalidArgument(
                    f"column {field.name!r} cannot hold the given values as {field.type}: {error}"
                ) from None
        else:
            columns.append(pa.nulls(rows, field.type))
    kinds = ["DELETE" if t == "DELETE" else "UPSERT" for t in types]
    stamp = time.time_ns()
    columns += [pa.array(kinds, pa.string()), pa.array(sequences, pa.string()),
                pa.array(seq_keys, pa.string()), pa.array([stamp] * rows, pa.int64()),
                pa.array(range(rows), pa.int64())]
    return pa.Table.from_arrays(columns, schema=pending_schema(schema))


def append(root: str | Path, rows: pa.Table, app_id: str | None, version: int | None) -> bool:
    """Commit prepared rows; False (nothing written) when (app_id, version) is already in."""
    path = pending_path(root)
    properties = None
    if app_id is not None:
        if version is None or version < 0:
            raise InvalidArgument(f"version {version!r} must be a non-negative integer")
        current = DeltaTable(path).transaction_version(app_id)
        if current is not None and current >= version:
            return False
        properties = CommitProperties(app_transactions=[Transaction(app_id, version)])
    if rows.num_rows == 0 and properties is None:
        return True
    write_deltalake(path, rows, mode="append", commit_properties=properties)
    return True


def applied_version(root: str | Path, app_id: str) -> int | None:
    return DeltaTable(pending_path(root)).transaction_version(app_id)

