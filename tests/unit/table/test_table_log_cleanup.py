"""A CDC table's own Delta log stays within its retention: with deletion vectors cdcflow
commits itself, and it now removes what delta-rs removes after its commits (the log entries
before a checkpoint that are older than `delta.logRetentionDuration`). Before, that log grew
by an entry per apply for good. Reads, Delta readers and the vacuum go on as before."""

from __future__ import annotations

import os
import random
from datetime import UTC, datetime
from pathlib import Path

import pytest
from deltalake import DeltaTable, QueryBuilder

from cdcflow import FakeClock
from cdcflow.table import CdcTable, apply
from tests.unit.table.test_vacuum import HOUR, churn, make_table

pytestmark = pytest.mark.unit
LONG_AGO = 1_000_000_000  # 2001: far past the default 30 days


def versions(root: Path) -> list[int]:
    return sorted(int(p.stem) for p in (root / "_delta_log").glob("*.json"))


def age(root: Path) -> list[int]:
    """Make the log's entries look written long ago to its cleanup; return their versions."""
    old = versions(root)
    for version in old:
        os.utime(root / "_delta_log" / f"{version:020d}.json", (LONG_AGO, LONG_AGO))
    return old


def rows(table: CdcTable) -> list[tuple[int, int]]:
    return sorted((r["id"], r["v"]) for r in table.to_arrow().to_pylist())


def test_log_entries_past_their_retention_go_at_a_checkpoint(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(apply, "CHECKPOINT_INTERVAL", 10)  # a checkpoint every 10 commits
    clock = FakeClock(datetime(2026, 11, 28, tzinfo=UTC))
    table = make_table(tmp_path / "t", clock, vectors=True)
    rng = random.Random(5)
    churn(table, 14, rng, clock)
    old = age(table.root)
    churn(table, 20, rng, clock)
    kept = versions(table.root)
    assert kept[0] > 0, "no log entry was removed"
    assert set(kept) > set(range(old[-1] + 1, kept[-1] + 1))  # every recent entry stays
    assert {v for v in old if v not in kept} == set(range(kept[0]))
    expected = rows(table)
    assert rows(CdcTable.open(table.root)) == expected
    plain = QueryBuilder().register("t", DeltaTable(str(table.root))).execute(
        "SELECT id, v FROM t").read_all()  # a third-party reader, from the checkpoint on
    assert sorted(zip(plain.column("id").to_pylist(), plain.column("v").to_pylist(),
                      strict=True)) == expected
    clock.advance(2 * HOUR)
    table.vacuum()  # the history it reads still reaches back past its retention
    assert rows(CdcTable.open(table.root)) == expected


def test_a_table_that_turned_the_cleanup_off_keeps_its_log(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(apply, "CHECKPOINT_INTERVAL", 10)
    clock = FakeClock(datetime(2026, 11, 28, tzinfo=UTC))
    table = make_table(tmp_path / "t", clock, vectors=True)
    DeltaTable(str(table.root)).alter.set_table_properties(
        {"delta.enableExpiredLogCleanup": "false"})
    rng = random.Random(6)
    churn(table, 14, rng, clock)
    age(table.root)
    churn(table, 20, rng, clock)
    assert versions(table.root)[0] == 0
