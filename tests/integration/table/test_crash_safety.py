"""A writer SIGKILLed mid-append or mid-apply leaves a CDC table that, after the same work is
retried, equals the result without a crash (exactly-once appends, atomic apply commits)."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from cdcflow.table import CdcTable

pytestmark = pytest.mark.integration
SCHEMA = "id INT64 NOT NULL, v INT64, note STRING(MAX)"


def make_batches(count: int, size: int, seed: int) -> list[list[dict]]:
    rng = random.Random(seed)
    batches, sequence = [], 0
    for _ in range(count):
        batch = []
        for _ in range(size):
            sequence += 1
            key = rng.randrange(3000)
            if rng.random() < 0.2:
                batch.append({"id": key, "_CHANGE_TYPE": "DELETE",
                              "_CHANGE_SEQUENCE_NUMBER": f"{sequence:x}"})
            else:
                batch.append({"id": key, "v": sequence, "note": "x" * rng.randrange(40),
                              "_CHANGE_TYPE": "UPSERT", "_CHANGE_SEQUENCE_NUMBER": f"{sequence:x}"})
        batches.append(batch)
    return batches


def expected_rows(batches: list[list[dict]],
                  start: dict[int, tuple] | None = None) -> dict[int, tuple]:
    state: dict[int, tuple] = dict(start or {})
    for row in sorted((r for b in batches for r in b),
                      key=lambda r: int(r["_CHANGE_SEQUENCE_NUMBER"], 16)):
        if row["_CHANGE_TYPE"] == "DELETE":
            state.pop(row["id"], None)
        else:
            state[row["id"]] = (row["v"], row["note"])
    return state


def write_and_apply(path: str, batch: list[dict], version: int, phase_file: str) -> None:
    table = CdcTable.open(path)
    Path(phase_file).write_text("appending")
    table.connection().append(batch, app_id="writer", version=version)
    Path(phase_file).write_text("applying")
    table.apply()
    Path(phase_file).write_text("done")


def kill_and_retry(table: CdcTable, batches: list[list[dict]], folder: Path,
                   seed: int) -> set[str]:
    """Each batch: a writer appends and applies and is SIGKILLed at a random point of the
    append (even batches) or the apply (odd ones); then the work is retried in-process.
    Returns the phases the kills landed in."""
    context = multiprocessing.get_context("spawn")
    rng = random.Random(seed)
    interrupted: set[str] = set()
    for version, batch in enumerate(batches):
        phase = str(folder / f"phase-{version}")
        target = "appending" if version % 2 == 0 else "applying"
        process = context.Process(target=write_and_apply,
                                  args=(str(table.root), batch, version, phase))
        process.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert process.is_alive() or os.path.exists(phase), "the writer died on its own"
            if os.path.exists(phase) and Path(phase).read_text() in (target, "done"):
                break
            time.sleep(0.001)
        time.sleep(rng.uniform(0, 0.03 if target == "appending" else 0.15))
        seen = Path(phase).read_text()
        os.kill(process.pid, signal.SIGKILL)
        process.join()
        interrupted.add(seen)
        # the retry: the same append (skipped if it had committed) and an apply
        table.connection().append(batch, app_id="writer", version=version)
        table.apply()
    return interrupted


def test_killed_appends_and_applies_then_retried_equal_the_clean_result(tmp_path: Path):
    batches = make_batches(10, 4000, seed=5)
    path = str(tmp_path / "t")
    table = CdcTable.create(path, SCHEMA, ["id"], target_file_rows=400)
    interrupted = kill_and_retry(table, batches, tmp_path, seed=9)
    assert {"appending", "applying"} <= interrupted
    got = {r["id"]: (r["v"], r["note"]) for r in table.to_arrow().to_pylist()}
    assert got == expected_rows(batches)
    assert not table.has_pending_changes()
    again = CdcTable.open(path)
    assert {r["id"] for r in again.to_arrow().to_pylist()} == set(got)


def test_killed_merge_on_read_applies_leave_a_table_every_reader_agrees_on(tmp_path: Path):
    """Issue 11, goal 5: with deletion_vectors a killed apply leaves, at worst, vectors and
    patches that no commit names; the retry's result equals the clean one for cdcflow and
    for a third-party Delta reader (DataFusion)."""
    size = 40_000
    table = CdcTable.create(tmp_path / "t", SCHEMA, ["id"], target_file_rows=10_000,
                            deletion_vectors=True)
    table.bulk_load(pa.table({"id": pa.array(range(size), pa.int64()),
                              "v": pa.array([-1] * size, pa.int64()), "note": ["base"] * size}))
    rng = random.Random(3)
    batches = [[{**row, "id": rng.randrange(size)} for row in batch]
               for batch in make_batches(12, 300, seed=11)]
    interrupted = kill_and_retry(table, batches, tmp_path, seed=13)
    assert {"appending", "applying"} <= interrupted
    expected = expected_rows(batches, {i: (-1, "base") for i in range(size)})
    got = {r["id"]: (r["v"], r["note"]) for r in table.to_arrow().to_pylist()}
    assert got == expected
    stats = table.apply_jobs()
    assert any(job.get("files_patched") for job in stats)
    third_party = QueryBuilder().register("t", DeltaTable(str(table.root))).execute(
        "SELECT id, v, note FROM t")
    assert {r["id"]: (r["v"], r["note"]) for r in pa.table(third_party.read_all()).to_pylist()} \
        == expected
