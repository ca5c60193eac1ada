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


def commit_pending_files(root: str, files: list[dict[str, Any]], app_id: str,
                         batch_id: int) -> bool:
    """Register written files in one Delta commit with (app_id, batch_id); False if the batch
    was committed before (the files of this attempt stay orphans, never read)."""
    table = DeltaTable(pending_path(root))
    current = table.transaction_version(app_id)
    if current is not None and current >= batch_id:
        return False
    now = int(time.time() * 1000)
    actions: list[AddAction | RemoveAction] = [AddAction(f["path"], int(f["size"]), {}, now, True,
                         json.dumps({"numRecords": int(f["rows"])})) for f in files]
    table.create_write_transaction(
        actions, mode="append", schema=table.schema(),
        commit_properties=CommitProperties(app_transactions=[Transaction(app_id, batch_id)]),
    )
    return True


def cdc_table_sink(path: str | Path, app_id: str | None = None) -> Callable[[Any, int], None]:
    """A `foreachBatch` function appending each batch (rows with _CHANGE_TYPE and optional
    _CHANGE_SEQUENCE_NUMBER) to the CDC table at `path`, exactly once per batch id."""
    table = CdcTable.open(path)
    root = str(table.root.resolve())
    app = app_id or f"spark-sink:{root}"
    schema, key = table.schema, table.primary_key
    connection_mode: list[str] = []

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

    def write(frame: Any, batch_id: int) -> None:
        done = applied_version(root, app)
        if done is not None and done >= batch_id:
            return
        files = [r.asDict() for r in frame.mapInArrow(write_partition, FILES_SCHEMA).collect()]
        modes = {f["mode"] for f in files} | set(connection_mode)
        if len(modes) > 1:
            raise InvalidArgument(
                f"{INVALID_CHANGE_TYPE}: batch {batch_id} mixes UPSERT/DELETE rows with INSERT "
                "or untyped rows on one sink (AP-3); nothing of it was committed"
            )
        commit_pending_files(root, files, app, batch_id)
        connection_mode[:] = sorted(modes)

    return write
