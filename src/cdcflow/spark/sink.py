"""Writing Spark DataFrames into CDC tables, exactly once per batch id.

Executors validate their rows and write pending Parquet files straight into each table's
pending Delta table folder; only small file descriptions reach the driver, which commits them
as Delta add actions in one transaction per table carrying the app-transaction id
(app, batch id). A replayed batch finds its id committed and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from cdcflow.clock import SYSTEM_CLOCK
from cdcflow.errors import InvalidArgument
from cdcflow.spark.worker_heap import settle_task_heap
from cdcflow.table import CdcTable, Connection
from cdcflow.table.pending import (
    CHANGE_TYPE,
    INVALID_CHANGE_TYPE,
    applied_version,
    change_mode,
    commit_pending_files,
    ingest_stamp,
    prepare,
    write_pending_file,
)

FILES_SCHEMA = "table_root STRING, path STRING, size BIGINT, rows BIGINT, mode STRING"


def _partition_writer(root: str, schema: pa.Schema, key: tuple[str, ...]) -> Any:
    def write_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        settle_task_heap()
        received = list(batches)
        if not received:
            return
        rows = pa.Table.from_batches(received)
        if rows.num_rows:
            types = (rows.column(CHANGE_TYPE).to_pylist() if CHANGE_TYPE in rows.column_names
                     else [None] * rows.num_rows)
            prepared = prepare(rows, schema, key, ingest_stamp(SYSTEM_CLOCK))
            described = write_pending_file(root, prepared)
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


def append_frame(connection: Connection, frame: Any, app_id: str | None = None,
                 version: int | None = None) -> bool:
    """Append a Spark DataFrame on a CDC-table connection: executors write pending files, the
    driver commits them in one Delta transaction (with (app_id, version) when given; a retry
    of a committed one writes nothing and returns False)."""
    table = connection.table
    resolved = str(table.root.resolve())
    if app_id is not None:
        done = applied_version(resolved, app_id)
        if done is not None and done >= (version or 0):
            return False
    writer = _partition_writer(resolved, table.schema, table.primary_key)
    files = [r.asDict() for r in frame.mapInArrow(writer, FILES_SCHEMA).collect()]
    mode = _check_modes(files, connection.mode, "this DataFrame")
    written = commit_pending_files(resolved, files, app_id,
                                   None if app_id is None else (version or 0), table.clock)
    connection.mode = mode
    return written


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
        commit_pending_files(root, files, app, batch_id, table.clock)
        connection_mode[:] = [mode] if mode else []

    return write
