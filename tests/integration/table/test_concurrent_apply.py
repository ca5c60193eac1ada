"""Appends racing a background apply in another process (AP-4, AP-5): an apply that removes
applied pending files may commit between an append's read and its commit; the append is
tried again, never lost, never doubled (its app transaction is checked again each time)."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cdcflow.clock import SYSTEM_CLOCK
from cdcflow.table import CdcTable
from cdcflow.table.pending import (
    commit_pending_files,
    ingest_stamp,
    prepare,
    write_pending_file,
)

pytestmark = pytest.mark.integration
BATCHES = 120


def apply_until_stopped(root: str, stop: Any, applies: Any) -> None:
    table = CdcTable.open(root)
    while not stop.is_set():
        table.apply()
        applies.value += 1


def batch_rows(batch: int) -> pa.Table:
    keys = [batch * 7 % 300 + n for n in range(5)]
    return pa.table({"id": pa.array(keys, pa.int64()), "v": pa.array([batch] * 5, pa.int64()),
                     "_CHANGE_TYPE": ["UPSERT"] * 5,
                     "_CHANGE_SEQUENCE_NUMBER": [f"{batch:x}"] * 5})


def append_batch(table: CdcTable, batch: int) -> None:
    """Even batches the way Spark executors do (file, then commit); odd ones by a connection."""
    rows = batch_rows(batch)
    if batch % 2:
        table.connection().append(rows, app_id="connection", version=batch)
        return
    root = str(table.root.resolve())
    prepared = prepare(rows, table.schema, table.primary_key, ingest_stamp(SYSTEM_CLOCK))
    commit_pending_files(root, [write_pending_file(root, prepared)], "executors", batch,
                         SYSTEM_CLOCK)


def test_appends_racing_applies_in_another_process_are_all_kept_once(tmp_path: Path):
    root = str(tmp_path / "t")
    table = CdcTable.create(root, "id INT64 NOT NULL, v INT64", ["id"])
    context = multiprocessing.get_context("spawn")
    stop, applies = context.Event(), context.Value("i", 0)
    applier = context.Process(target=apply_until_stopped, args=(root, stop, applies))
    applier.start()
    try:
        deadline = time.monotonic() + 120
        while applies.value < 1:  # the applier is up before the appends begin
            assert time.monotonic() < deadline and applier.is_alive(), "no apply within 120 s"
            time.sleep(0.05)
        for batch in range(BATCHES):
            append_batch(table, batch)
        raced = applies.value
    finally:
        stop.set()
        applier.join(60)
    assert applier.exitcode == 0
    assert raced >= 3, "the applies must have run while the appends went on"
    append_batch(table, BATCHES - 1)  # a repeat of a committed batch: nothing new
    append_batch(table, BATCHES - 2)
    table.apply()
    expected: dict[int, int] = {}
    for batch in range(BATCHES):
        for key in batch_rows(batch).column("id").to_pylist():
            expected[key] = batch
    rows = {r["id"]: r["v"] for r in table.to_arrow().to_pylist()}
    assert rows == expected
