"""CS-8 under concurrent writer processes: after a heartbeat at T in a partition, no record
with commit_timestamp <= T arrives in that partition; records arrive in (timestamp) order."""

from __future__ import annotations

import multiprocessing
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdcflow import Database, PartitionPolicy
from cdcflow.follow import follow_change_stream
from cdcflow.testing import (
    WORKLOAD_DDL,
    expected_history,
    observed_history,
    run_writer,
)

pytestmark = pytest.mark.property


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    writers=st.integers(min_value=1, max_value=3),
    partitions=st.integers(min_value=1, max_value=4),
    pause=st.sampled_from([0.0, 1.5]),
    seed=st.integers(min_value=0, max_value=10_000),
)
def test_no_record_at_or_before_a_heartbeat_arrives_after_it(
    writers: int, partitions: int, pause: float, seed: int
):
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "hb.db")
        db = Database.open(path, partition_policy=PartitionPolicy(auto=False),
                           initial_partitions=partitions)
        db.ddl(WORKLOAD_DDL)
        db.ddl("CREATE CHANGE STREAM Everything FOR ALL")
        start = db.partitions("Everything")[0].start_timestamp
        context = multiprocessing.get_context("spawn")
        histories = [str(Path(folder) / f"h{i}.jsonl") for i in range(writers)]
        processes = [
            context.Process(target=run_writer,
                            args=(path, seed + i, 40 if pause == 0 else 5, histories[i], 50,
                                  pause))
            for i in range(writers)
        ]
        for process in processes:
            process.start()
        time.sleep(0.5)
        end = db.current_timestamp() + timedelta(seconds=4.5)
        seen = follow_change_stream(db, "Everything", start, end, heartbeat_ms=1000)
        for process in processes:
            process.join(timeout=120)
            assert process.exitcode == 0
        heartbeats = 0
        for token, events in seen.timeline.items():
            promised = -1
            last = -1
            for kind, micros in events:
                if kind == "heartbeat":
                    heartbeats += 1
                    assert micros >= promised, f"{token}: heartbeat went backwards"
                    promised = micros
                else:
                    assert micros > promised, f"{token}: record at {micros} after heartbeat"
                    assert micros >= last
                last = max(last, micros)
        assert heartbeats > 0
        cut = int(end.timestamp() * 1_000_000)
        expected = {
            k: [e for e in v if e[0] <= cut] for k, v in expected_history(histories).items()
        }
        assert observed_history(seen.records) == {k: v for k, v in expected.items() if v}
