"""The streaming source end to end (issue 3): concurrent writers and partition churn, exactly
once across a SIGKILL of the driver, triggers, and the backfill-to-stream handoff."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import pytest

from cdcflow import Database, PartitionPolicy
from cdcflow.model.timestamps import parse_timestamp, to_micros
from cdcflow.testing import (
    WORKLOAD_DDL,
    expected_history,
    observed_history,
    records_from_rows,
    run_partition_churn,
    run_writer,
)

pytestmark = pytest.mark.integration
POLICY = PartitionPolicy(split_records=120, max_partitions=6, merge_min_age_seconds=0.5,
                         merge_max_records_per_second=30.0, check_interval_seconds=0.2)


def _prepare(tmp_path: Path) -> tuple[Database, str]:
    path = str(tmp_path / "spark.db")
    db = Database.open(path, partition_policy=POLICY)
    db.ddl(WORKLOAD_DDL)
    db.ddl("CREATE CHANGE STREAM Everything FOR ALL")
    return db, path


def _start_load(path: str, tmp_path: Path, writers: int, transactions: int,
                pause: float, churn_seconds: float) -> tuple[list[Any], list[str]]:
    context = multiprocessing.get_context("spawn")
    histories = [str(tmp_path / f"history-{i}.jsonl") for i in range(writers)]
    processes = [context.Process(target=run_writer,
                                 args=(path, 50 + i, transactions, histories[i], 200, pause))
                 for i in range(writers)]
    processes.append(context.Process(target=run_partition_churn,
                                     args=(path, "Everything", churn_seconds, 3)))
    for process in processes:
        process.start()
    return processes, histories


def _check_batches(batches: dict[int, list[dict]], histories: list[str]) -> None:
    """Every mod once, per-key commit order, every transaction whole in one batch, batches
    aligned to increasing global timestamps, and the union equal to the history."""
    identities = [(r["server_transaction_id"], r["record_sequence"], r["mod_index"])
                  for rows in batches.values() for r in rows]
    assert len(identities) == len(set(identities)), "a mod was delivered twice"
    batch_of_txn: dict[str, set[int]] = defaultdict(set)
    records_of_txn: dict[str, set[tuple[str, str]]] = defaultdict(set)
    expected_records: dict[str, int] = {}
    for batch_id, rows in batches.items():
        for r in rows:
            txn = r["server_transaction_id"]
            batch_of_txn[txn].add(batch_id)
            records_of_txn[txn].add((r["record_sequence"], r["partition_token"]))
            expected_records[txn] = r["number_of_records_in_transaction"]
    assert all(len(ids) == 1 for ids in batch_of_txn.values()), "a transaction was split"
    assert all(len(records_of_txn[t]) == n for t, n in expected_records.items())
    spans = [(min(_ts(r) for r in rows), max(_ts(r) for r in rows), batch_id)
             for batch_id, rows in sorted(batches.items()) if rows]
    for (_, high, one), (low, _, two) in itertools.pairwise(spans):
        assert high < low, f"batch {two} holds a commit older than batch {one}"
    ordered = [r for _, rows in sorted(batches.items()) for r in rows]
    assert observed_history(records_from_rows(ordered)) == expected_history(histories)


def _ts(row: dict) -> int:
    stamp = row["commit_timestamp"]
    if isinstance(stamp, str):
        return to_micros(parse_timestamp(stamp))
    return to_micros(stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC))


def test_stream_with_concurrent_writers_and_partition_churn(spark, tmp_path: Path):
    db, path = _prepare(tmp_path)
    processes, histories = _start_load(path, tmp_path, 2, 250, 0.004, 4.0)
    batches: dict[int, list[dict]] = {}

    def collect(frame, batch_id: int) -> None:
        batches[batch_id] = [r.asDict() for r in frame.collect()]

    query = (spark.readStream.format("cdcflow").option("database", path)
             .option("stream", "Everything").option("startingTimestamp", "earliest")
             .option("heartbeatMilliseconds", 1000).load()
             .writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        for process in processes:
            process.join(timeout=300)
            assert process.exitcode == 0
        final = to_micros(db.current_timestamp())
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            progress = query.lastProgress
            if progress and progress["sources"][0]["endOffset"] and json.loads(
                    progress["sources"][0]["endOffset"])["timestamp"] >= final:
                break
            time.sleep(0.5)
        else:
            pytest.fail("the query did not catch up with the final commit")
    finally:
        query.stop()
    partitions = db.partitions("Everything")
    assert sum(len(p.parent_tokens) == 2 for p in partitions) >= 1, "no merge happened"
    assert len([b for b in batches.values() if b]) >= 3
    _check_batches(batches, histories)
    widest = max(len({r["partition_token"] for r in rows}) for rows in batches.values())
    assert widest >= 2, "batches should read several partitions in parallel"


def _run_job(path: str, checkpoint: Path, sink: Path, mode: str, slow: bool
             ) -> subprocess.Popen[bytes]:
    script = Path(__file__).with_name("stream_job.py")
    args = [sys.executable, str(script), path, str(checkpoint), str(sink), mode]
    return subprocess.Popen(args + (["slow"] if slow else []), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_sigkill_mid_batch_then_restart_delivers_every_mod_exactly_once(tmp_path: Path):
    _db, path = _prepare(tmp_path)
    processes, histories = _start_load(path, tmp_path, 2, 300, 0.01, 5.0)
    sink, checkpoint = tmp_path / "sink", tmp_path / "ckpt"
    job = _run_job(path, checkpoint, sink, "processing", slow=True)
    deadline = time.monotonic() + 180
    while not (sink / "started-000002").exists():
        assert job.poll() is None, "the streaming job died on its own"
        assert time.monotonic() < deadline, "the job never reached batch 2"
        time.sleep(0.05)
    os.killpg(job.pid, signal.SIGKILL)  # the driver and its JVM, mid-batch
    job.wait()
    assert not (sink / "batch-000002.json").exists(), "the kill came after the batch"
    for process in processes:
        process.join(timeout=300)
        assert process.exitcode == 0
    rerun = _run_job(path, checkpoint, sink, "availableNow", slow=False)
    assert rerun.wait(timeout=300) == 0
    batches = {int(f.stem.split("-")[1]): json.loads(f.read_text())
               for f in sink.glob("batch-*.json")}
    assert 2 in batches
    _check_batches(batches, histories)


def test_backfill_snapshot_then_stream_from_its_timestamp(spark, tmp_path: Path):
    db, path = _prepare(tmp_path)
    processes, _ = _start_load(path, tmp_path, 2, 200, 0.005, 3.0)
    deadline = time.monotonic() + 120
    while len(list(db.scan("Accounts"))) < 20:  # the snapshot comes while writers write
        assert time.monotonic() < deadline, "the writers wrote nothing"
        time.sleep(0.05)
    at = db.current_timestamp()
    snapshot = (spark.read.format("cdcflow").option("database", path).option("table", "Accounts")
                .option("readTimestamp", at.isoformat()).option("numPartitions", 3).load())
    state = {(r["Id"],): r.asDict() for r in snapshot.collect()}
    for process in processes:
        process.join(timeout=300)
        assert process.exitcode == 0
    rows: list[dict] = []
    query = (spark.readStream.format("cdcflow").option("database", path)
             .option("stream", "Everything")
             .option("startingTimestamp", (at + timedelta(microseconds=1)).isoformat()).load()
             .writeStream.foreachBatch(lambda f, _: rows.extend(r.asDict() for r in f.collect()))
             .option("checkpointLocation", str(tmp_path / "ckpt2"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert rows, "no change came after the snapshot: it was not taken mid-load"
    assert all(_ts(r) > to_micros(at) for r in rows), "overlap with the snapshot"
    for record in records_from_rows(rows):
        if record.table_name != "Accounts":
            continue
        (keys, new, _), = record.decoded_mods()
        key = (keys["Id"],)
        if record.mod_type == "DELETE":
            state.pop(key)
        elif record.mod_type == "INSERT":
            assert key not in state, "an insert of a row the snapshot already had"
            state[key] = {**keys, **new}
        else:
            state[key] = {**state[key], **new}
    final = {(r["Id"],): r for r in db.scan("Accounts")}
    assert state == final
    assert len(final) > 10


def test_triggers_once_and_an_idle_stream(spark, tmp_path: Path):
    db, path = _prepare(tmp_path)
    with db.transaction() as tx:
        tx.insert("Accounts", {"Id": 1, "Balance": 5})
    seen: list[tuple[int, int]] = []
    frame = (spark.readStream.format("cdcflow").option("database", path)
             .option("stream", "Everything").option("startingTimestamp", "earliest").load())
    once = (frame.writeStream.foreachBatch(lambda f, i: seen.append((i, f.count())))
            .option("checkpointLocation", str(tmp_path / "c1")).trigger(once=True).start())
    once.awaitTermination(120)
    assert seen == [(0, 1)]
    idle: list[int] = []
    query = (frame.writeStream.foreachBatch(lambda f, i: idle.append(f.count()))
             .option("checkpointLocation", str(tmp_path / "c1"))
             .trigger(processingTime="200 milliseconds").start())
    time.sleep(3)
    assert sum(idle) == 0, "an idle stream delivered rows"
    with db.transaction() as tx:
        tx.insert("Accounts", {"Id": 2, "Balance": 6})
    deadline = time.monotonic() + 60
    while sum(idle) < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    query.stop()
    assert sum(idle) == 1


def test_batch_read_of_a_change_range_and_raw_records(spark, tmp_path: Path):
    db, path = _prepare(tmp_path)
    start = db.current_timestamp() + timedelta(microseconds=1)
    with db.transaction() as tx:
        tx.insert("Accounts", {"Id": 1, "Balance": 5})
        tx.insert("Ledger", {"Book": "a", "Entry": 1, "Amount": 3})
    (root,) = db.partitions("Everything")
    db.split_partition("Everything", root.token)
    with db.transaction() as tx:
        tx.update("Accounts", {"Id": 1, "Balance": 6})
    end = db.current_timestamp()
    frame = (spark.read.format("cdcflow").option("database", path).option("stream", "Everything")
             .option("startingTimestamp", start.isoformat())
             .option("endingTimestamp", end.isoformat()).load())
    rows = sorted(frame.collect(), key=lambda r: (r["commit_timestamp"], r["record_sequence"]))
    assert [(r["table_name"], r["mod_type"]) for r in rows] == [
        ("Accounts", "INSERT"), ("Ledger", "INSERT"), ("Accounts", "UPDATE")]
    assert json.loads(rows[2]["new_values"]) == {"Balance": 6}
    assert frame.rdd.getNumPartitions() == 3
    raw = (spark.read.format("cdcflow").option("database", path).option("stream", "Everything")
           .option("startingTimestamp", start.isoformat()).option("rawRecords", "true")
           .option("endingTimestamp", end.isoformat()).load().collect())
    kinds = sorted({r["record_type"] for r in raw})
    assert kinds == ["child_partitions_record", "data_change_record", "heartbeat_record"]
    child = next(json.loads(r["record"]) for r in raw
                 if r["record_type"] == "child_partitions_record")
    assert child["child_partitions"][0]["parent_partition_tokens"] == [root.token]
