"""Vacuum beside readers in other processes, and vacuums SIGKILLed at random points: a
reader of any version current within the retention never misses a file, and a killed vacuum
leaves a table that reads the same and that the next vacuum finishes cleaning."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from cdcflow.table import CdcTable
from tests.unit.table.test_vacuum import named_now, on_disk

pytestmark = pytest.mark.integration
SCHEMA = "id INT64 NOT NULL, v INT64"
RETENTION = timedelta(seconds=6)
"""Longer than any reader here holds a version (about two seconds)."""


def read_until(root: str, seconds: float, out: Any) -> None:
    """Read the table over and over, as users do: whole and by keys, and range by range with
    some work on each range (a slow consumer holds one version for about two seconds, a
    third of the retention); report the passes done, and the failures of reads that held
    their version for less than the retention."""
    table, failures, count = CdcTable.open(root), [], 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        began = time.monotonic()
        try:
            rows = table.to_arrow().to_pylist()
            table.lookup([(k,) for k in range(0, 300, 11)])
            assert all(r["v"] >= 0 for r in rows)
            for part in table.applied_parts():
                assert part.num_rows >= 0
                time.sleep(0.3)  # the consumer's work on a range, not a wait for anything
            count += 1
        except Exception as error:  # every failure within the retention is reported
            if time.monotonic() - began < RETENTION.total_seconds():
                failures.append(f"{type(error).__name__}: {error}")
    out.put((count, failures[:5]))


def age_every_file(root: Path) -> None:
    """Files written an hour ago: only the versions in use keep a file, not its age."""
    old = time.time() - 3600  # file times, not the clock cdcflow reads
    for path in root.rglob("*"):
        if path.is_file():
            os.utime(path, (old, old))


def upserts(rng: random.Random, size: int) -> list[dict[str, Any]]:
    return [{"id": rng.randrange(300), "v": rng.randrange(10**6),
             "_CHANGE_TYPE": rng.choice(["UPSERT", "UPSERT", "DELETE"])} for _ in range(size)]


def test_readers_never_miss_a_file_while_applies_and_vacuums_run(tmp_path: Path):
    table = CdcTable.create(tmp_path / "t", SCHEMA, ["id"], target_file_rows=50)
    rng = random.Random(11)
    table.connection().append(upserts(rng, 200))
    table.apply()
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    readers = [context.Process(target=read_until, args=(str(table.root), 15.0, out))
               for _ in range(2)]
    for reader in readers:
        reader.start()
    deleted = 0
    deadline = time.monotonic() + 15.0
    while time.monotonic() < deadline:
        table.connection().append(upserts(rng, 40))
        table.apply()
        age_every_file(table.root)
        deleted += len(table.vacuum(RETENTION, enforce_retention=False).files)
    results = [out.get(timeout=120) for _ in readers]
    for reader in readers:
        reader.join(60)
    assert deleted > 50, "the vacuums deleted next to nothing: the test proved nothing"
    assert all(count > 3 for count, _ in results), results
    assert [f for _, failures in results for f in failures] == []


def vacuum_forever(root: str) -> None:
    table = CdcTable.open(root)
    while True:
        table.vacuum(timedelta(0), enforce_retention=False)


def test_a_vacuum_killed_at_random_points_loses_nothing(tmp_path: Path):
    """Each round leaves hundreds of files to delete, and kills the vacuum a random moment
    after it deleted its first."""
    table = CdcTable.create(tmp_path / "t", SCHEMA, ["id"], target_file_rows=20)
    rng = random.Random(13)
    context = multiprocessing.get_context("spawn")
    cut_short = 0
    for _ in range(6):
        for _ in range(15):  # garbage: every apply replaces the ranges it touches
            table.connection().append(upserts(rng, 30))
            table.apply()
        expected = sorted((r["id"], r["v"]) for r in table.to_arrow().to_pylist())
        garbage = sorted(on_disk(table.root) - named_now(table))
        watched = [table.root / name for name in garbage[:: max(1, len(garbage) // 20)]]
        worker = context.Process(target=vacuum_forever, args=(str(table.root),))
        worker.start()
        deadline = time.monotonic() + 60
        while all(path.exists() for path in watched):  # until it starts deleting
            assert time.monotonic() < deadline, "the vacuum deleted nothing in 60 s"
        time.sleep(rng.uniform(0, 0.01))  # a random point of its work, not a wait for it
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(30)
        cut_short += any((table.root / name).exists() for name in garbage)
        assert sorted((r["id"], r["v"]) for r in table.to_arrow().to_pylist()) == expected
        assert DeltaTable(str(table.root)).to_pyarrow_table().num_rows == len(expected)
    assert cut_short >= 1, "every kill came after the vacuum was done: the test proved nothing"
    table.vacuum(timedelta(0), enforce_retention=False)
    assert on_disk(table.root) == named_now(table)
