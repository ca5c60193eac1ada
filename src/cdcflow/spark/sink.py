"""Writing Spark micro-batches into CDC tables, exactly once per batch id.

Executors validate their rows and write pending Parquet files straight into each table's
pending Delta table folder; only small file descriptions reach the driver, which commits them
as Delta add actions in one transaction per table carrying the app-transaction id
(app, batch id). A replayed batch finds its id committed and changes nothing.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction

from cdcflow.errors import InvalidArgument
from cdcflow.table import CdcTable
from cdcflow.table.pending import (
    CHANGE_TYPE,
    INVALID_CHANGE_TYPE,
    applied_version,
    change_mode,
    pending_path,
    prepare,
)

FILES_SCHEMA = "table_root STRING, path STRING, size BIGINT, rows BIGINT, mode STRING"


def write_pending_file(root: str, prepared: pa.Table) -> dict[str, Any]:
    """Write prepared pending rows as one Parquet file in the table's pending folder."""
    name = f"part-{uuid.uuid4().hex}.parquet"
    folder = Path(pending_path(root))
    temporary = folder / f".{name}.tmp"
    pq.write_table(prepared, temporary)
    os.replace(temporary, folder / name)
    return {"table_root": root, "path": name, "size": (folder / name).stat().st_size,
            "rows": prepared.num_rows}


def commit_pending_files(root: str, files: list[dict[str, Any]], app_id: str | None,
                         batch_id: int | None) -> bool:
    """Register written files in one Delta commit with (app_id, batch_id); False if the batch
    was committed before (the files of this attempt stay orphans, never read)."""
    table = DeltaTable(pending_path(root))
    if app_id is not None and batch_id is not None:
        current = table.transaction_version(app_id)
        if current is not None and current >= batch_id:
            return False
    transactions = ([Transaction(app_id, batch_id)]
                    if app_id is not None and batch_id is not None else None)
    now = int(time.time() * 1000)
    actions: list[AddAction | RemoveAction] = [AddAction(f["path"], int(f["size"]), {}, now, True,
                         json.dumps({"numRecords": int(f["rows"])})) for f in files]
    table.create_write_transaction(
        actions, mode="append", schema=table.schema(),
        commit_properties=CommitProperties(app_transactions=transactions),
    )
    return True


def _partition_writer(root: str, schema: pa.Schema, key: tuple[str, ...]) -> Any:
    def write_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        received = list(batches)
        if not received:
            return
        rows = pa.Table.from_batches(received)
        if rows.num_rows:
            types = (rows.column(CHANGE_TYPE).to_pylist() if CHANGE_TYPE in rows.column_names
                     else [None] * rows.num_rows)
            described = write_pending_file(root, prepare(rows, schema, key))
            described["mode"] = change_mode(types)  # AP-3 is checked across partitions
            yield pa.RecordBatch.from_pylist([described])

    return write_partition


def _check_modes(files: list[dict[str, Any]], previous: str | None, what: str) -> str | None:
    modes = {f["mode"] for f in files} | ({previous} if previous else set())
    if len(modes) > 1:
        raise InvalidArgument(
            f"{INVALID_CHANGE_TYPE}: {what} mixes UPSERT/DELETE rows with INSERT or untyped "
            "rows on one connection (AP-3); nothing of it was committed"
        )
    return next(iter(modes), None)


def append_spark_frame(root: str | Path, frame: Any, app_id: str | None, version: int | None,
                       mode: str | None) -> str | None:
    """Append a Spark DataFrame to a CDC table: executors write pending files, the driver
    commits them in one Delta transaction (with (app_id, version) when given)."""
    table = CdcTable.open(root)
    resolved = str(table.root.resolve())
    writer = _partition_writer(resolved, table.schema, table.primary_key)
    files = [r.asDict() for r in frame.mapInArrow(writer, FILES_SCHEMA).collect()]
    new_mode = _check_modes(files, mode, "this DataFrame")
    if app_id is None:
        commit_pending_files(resolved, files, None, None)
    else:
        commit_pending_files(resolved, files, app_id, version if version is not None else 0)
    return new_mode


def cdc_table_sink(path: str | Path, app_id: str | None = None) -> Callable[[Any, int], None]:
    """A `foreachBatch` function appending each batch (rows with _CHANGE_TYPE and optional
    _CHANGE_SEQUENCE_NUMBER) to the CDC table at `path`, exactly once per batch id."""
    table = CdcTable.open(path)
    root = str(table.root.resolve())
    app = app_id or f"spark-sink:{root}"
    write_partition = _partition_writer(root, table.schema, table.primary_key)
    connection_mode: list[str] = []

    def write(frame: Any, batch_id: int) -> None:
        done = applied_version(root, app)
        if done is not None and done >= batch_id:
            return
        files = [r.asDict() for r in frame.mapInArrow(write_partition, FILES_SCHEMA).collect()]
        mode = _check_modes(files, connection_mode[0] if connection_mode else None,
                            f"batch {batch_id}")
        commit_pending_files(root, files, app, batch_id)
        connection_mode[:] = [mode] if mode else []

    return write
