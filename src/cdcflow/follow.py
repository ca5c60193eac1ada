"""The change-stream query workflow (CS-4, CS-5): follow every partition of a stream.

`follow_change_stream` issues the NULL-token query, then reads each child partition exactly
once and only after all of its parents were read to their end, in a thread pool.
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

from cdcflow.model.records import ChangeRecord, DataChangeRecord
from cdcflow.model.timestamps import to_micros
from cdcflow.store.changelog import ChangeLog


@dataclass
class FollowResult:
    """What a lineage-following reader saw: data records in processing order, and per
    partition the heartbeats and data timestamps in the order they arrived."""

    records: list[DataChangeRecord]
    partitions_read: list[str]
    timeline: dict[str, list[tuple[str, int]]]
    by_partition: dict[str, list[DataChangeRecord]]


def follow_change_stream(
    database: ChangeLog,
    stream: str,
    start: datetime,
    end: datetime | None,
    heartbeat_ms: int = 1000,
    workers: int = 32,
    jitter_seconds: float = 0.0,
    on_record: Callable[[str, ChangeRecord], None] | None = None,
    keep: bool = True,
) -> FollowResult:
    """The CS query workflow: the NULL-token query first, then each child partition exactly
    once, and only after all of its parents have been read to their end (CS-4).

    `on_record(token, record)` sees every record as it arrives (from reader threads);
    `keep=False` does not collect them. `workers` bounds concurrent partition queries; a
    tailing follow (end None) needs at least as many as there can be active partitions.
    `jitter_seconds` > 0 pauses readers at random, so partitions read concurrently interleave
    and any record processed out of lineage order shows up as a per-key order error.
    """
    lock = threading.Lock()
    jitter = random.Random(11)
    result = FollowResult([], [], defaultdict(list), defaultdict(list))
    started: set[str] = set()
    finished: set[str] = set()
    pending: list[Future[None]] = []
    pool = ThreadPoolExecutor(max_workers=workers)

    def schedule(token: str, at: datetime) -> None:
        started.add(token)
        pending.append(pool.submit(read, token, at))

    def read(token: str, at: datetime) -> None:
        children = []
        for row in database.read_change_stream(stream, at, end, token, heartbeat_ms):
            if jitter_seconds and jitter.random() < 0.05:
                time.sleep(jitter.uniform(0, jitter_seconds))
            if on_record is not None:
                on_record(token, row)
            if not keep:
                if row.child_partitions_record is not None:
                    children.append(row.child_partitions_record)
                continue
            if row.data_change_record is not None:
                with lock:
                    result.records.append(row.data_change_record)
                    result.by_partition[token].append(row.data_change_record)
                    stamp = to_micros(row.data_change_record.commit_timestamp)
                    result.timeline[token].append(("data", stamp))
            elif row.heartbeat_record is not None:
                with lock:
                    result.timeline[token].append(("heartbeat", to_micros(row.timestamp)))
            elif row.child_partitions_record is not None:
                children.append(row.child_partitions_record)
        with lock:
            finished.add(token)
            result.partitions_read.append(token)
            for record in children:
                for child in record.child_partitions:
                    parents = set(child.parent_partition_tokens)
                    if child.token not in started and parents <= finished:
                        schedule(child.token, record.start_timestamp)

    (first,) = list(database.read_change_stream(stream, start, end, None, heartbeat_ms))
    assert first.child_partitions_record is not None
    with lock:
        for child in first.child_partitions_record.child_partitions:
            schedule(child.token, first.child_partitions_record.start_timestamp)
    while True:
        with lock:
            outstanding = [f for f in pending if not f.done()]
            failed = [f for f in pending if f.done() and f.exception() is not None]
        if failed:
            pool.shutdown(wait=False, cancel_futures=True)
            raise failed[0].exception()  # type: ignore[misc]
        if not outstanding:
            break
        outstanding[0].result()
    pool.shutdown()
    return result


