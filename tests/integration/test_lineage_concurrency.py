"""Lineage under concurrency (CS-3, CS-4, SH-4, SH-5): several writer processes commit random
transactions while partitions split and merge (manually and by policy); readers following the
query workflow, and the shard/iterator API, reproduce exactly the committed history."""

from __future__ import annotations

import multiprocessing
import time
from datetime import timedelta
from pathlib import Path

import pytest

from cdcflow import Database, PartitionPolicy
from cdcflow.follow import follow_change_stream
from cdcflow.testing import (
    WORKLOAD_DDL,
    expected_history,
    follow_shards,
    observed_history,
    run_partition_churn,
    run_writer,
    transaction_problems,
)

pytestmark = pytest.mark.integration

WRITERS = 3
TRANSACTIONS = 250


def _until(history: dict, micros: int) -> dict:
    cut = {k: [(t, s) for t, s in v if t <= micros] for k, v in history.items()}
    return {k: v for k, v in cut.items() if v}


def _table(history: dict, table: str, after: int) -> dict:
    cut = {k: [(t, s) for t, s in v if t >= after] for k, v in history.items() if k[0] == table}
    return {k: v for k, v in cut.items() if v}


def _assert_same(observed: dict, expected: dict) -> None:
    assert observed.keys() == expected.keys()
    for key in expected:
        assert observed[key] == expected[key], key


def test_concurrent_writers_and_partition_churn_keep_history_exact(tmp_path: Path):
    path = str(tmp_path / "lineage.db")
    policy = PartitionPolicy(split_records=150, max_partitions=8, merge_min_age_seconds=0.5,
                             merge_max_records_per_second=40.0, check_interval_seconds=0.2)
    db = Database.open(path, partition_policy=policy)
    db.ddl(WORKLOAD_DDL)
    db.ddl("CREATE CHANGE STREAM Everything FOR ALL")
    shard_stream = db.update_table("Accounts", enable_stream=True)
    assert shard_stream is not None
    enabled = db.list_streams("Accounts")[0].creation_time
    start = db.partitions("Everything")[0].start_timestamp
    context = multiprocessing.get_context("spawn")
    histories = [str(tmp_path / f"history-{i}.jsonl") for i in range(WRITERS)]
    writers = [
        context.Process(target=run_writer, args=(path, seed, TRANSACTIONS, histories[seed]))
        for seed in range(WRITERS)
    ]
    churn = context.Process(target=run_partition_churn, args=(path, "Everything", 5.0, 7))
    for process in [*writers, churn]:
        process.start()
    time.sleep(1.0)
    concurrent_end = db.current_timestamp() + timedelta(seconds=2)
    live = follow_change_stream(db, "Everything", start, concurrent_end, heartbeat_ms=1000)
    for process in [*writers, churn]:
        process.join(timeout=300)
        assert process.exitcode == 0
    final_end = db.current_timestamp()
    full = follow_change_stream(db, "Everything", start, final_end, heartbeat_ms=1000,
                                jitter_seconds=0.01)

    expected = expected_history(histories)
    assert sum(len(v) for v in expected.values()) > WRITERS * TRANSACTIONS
    partitions = db.partitions("Everything")
    assert sum(len(p.parent_tokens) == 2 for p in partitions) >= 1, "no merge happened"
    assert sum(len(p.parent_tokens) == 1 for p in partitions) >= 2, "too few splits"
    assert set(full.partitions_read) == {p.token for p in partitions}
    assert len(full.partitions_read) == len(set(full.partitions_read)), "a token read twice"

    _assert_partition_bounds(db, partitions, full.by_partition)
    end_micros = int(concurrent_end.timestamp() * 1_000_000)
    _assert_same(observed_history(live.records), _until(expected, end_micros))
    _assert_same(observed_history(full.records), expected)
    assert transaction_problems(full.records) == []

    shard_records = follow_shards(db, shard_stream)
    after = int(enabled.timestamp() * 1_000_000)
    _assert_same(observed_history(shard_records), _table(expected, "Accounts", after))


def _assert_partition_bounds(db: Database, partitions: list, by_partition: dict) -> None:
    """CS-2/CS-9: a partition holds only its key range and its time span [start, end)."""
    for partition in partitions:
        for record in by_partition.get(partition.token, []):
            assert record.commit_timestamp >= partition.start_timestamp
            if partition.end_timestamp is not None:
                assert record.commit_timestamp < partition.end_timestamp
            for mod in record.mods:
                key = tuple(mod.keys[c.name] for c in record.column_types if c.is_primary_key)
                position = db.key_hash(record.table_name, key)
                assert partition.key_range.contains(position), (partition.token, key)
