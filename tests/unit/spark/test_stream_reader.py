"""The streaming reader's methods called directly on hand-built states (no JVM):
lineage gating, offset round trips, admission control that keeps transactions whole."""

from __future__ import annotations

import itertools
import json
from datetime import timedelta

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from cdcflow import Database, PartitionPolicy
from cdcflow.errors import InvalidArgument, OutOfRange
from cdcflow.model.timestamps import to_micros
from cdcflow.spark.offsets import StreamOffset, admit, batch_end, frontier_at
from cdcflow.spark.options import parse_options
from cdcflow.spark.source import ChangeStreamReader, ChangeStreamSource, _slices

pytestmark = pytest.mark.unit


def reader(db: Database, **extra: str) -> ChangeStreamReader:
    options = {"database": db.path, "stream": "S", "startingTimestamp": "earliest", **extra}
    return ChangeStreamReader(parse_options(options), db)


@pytest.fixture
def sdb(db_path: str) -> Database:
    db = Database.open(db_path, partition_policy=PartitionPolicy(auto=False))
    db.ddl("CREATE TABLE K (Id INT64 NOT NULL, V INT64) PRIMARY KEY (Id)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    return db


def commit(db: Database, ids: list[int], value: int = 0) -> int:
    with db.transaction() as tx:
        for i in ids:
            tx.insert_or_update("K", {"Id": i, "V": value})
    assert tx.commit_timestamp is not None
    return to_micros(tx.commit_timestamp)


def rows_of(r: ChangeStreamReader, start: dict, end: dict) -> list[dict]:
    out = []
    for part in r.partitions(start, end):
        for batch in r.read(part):
            assert isinstance(batch, pa.RecordBatch)
            out.extend(batch.to_pylist())
    return out


def test_offsets_round_trip_and_are_plain_json(sdb: Database):
    r = reader(sdb)
    initial = r.initialOffset()
    assert json.loads(json.dumps(initial)) == initial
    assert initial["version"] == 1
    offset = StreamOffset.from_dict(initial)
    assert offset.to_dict() == initial
    (root,) = sdb.partitions("S")
    assert offset.frontier == (root.token,)
    assert offset.timestamp == to_micros(root.start_timestamp) - 1
    with pytest.raises(InvalidArgument, match="version 7"):
        StreamOffset.from_dict({**initial, "version": 7})


def test_child_partitions_wait_until_parents_are_read_to_their_end(sdb: Database):
    r = reader(sdb)
    start = r.initialOffset()
    first = commit(sdb, [1, 2, 3])
    (root,) = sdb.partitions("S")
    low, high = sdb.split_partition("S", root.token)
    split_at = to_micros(next(p for p in sdb.partitions("S") if p.token == low).start_timestamp)
    second = commit(sdb, [1, 2, 3], value=1)
    end = r.latestOffset(start, ReadAllAvailable())
    # the batch stops just before the parent ends: children are not in it
    assert end["timestamp"] == split_at - 1
    assert sorted(end["partitions"]) == sorted([low, high])
    assert [p.piece.token for p in r.partitions(start, end)] == [root.token]
    first_rows = rows_of(r, start, end)
    assert len(first_rows) == 3 and {x["partition_token"] for x in first_rows} == {root.token}
    assert {to_micros(x["commit_timestamp"]) for x in first_rows} == {first}
    after = r.latestOffset(end, ReadAllAvailable())
    assert after["timestamp"] == second
    tokens = sorted(p.piece.token for p in r.partitions(end, after))
    assert tokens == sorted([low, high])
    second_rows = rows_of(r, end, after)
    assert len(second_rows) == 3
    assert {x["partition_token"] for x in second_rows} <= {low, high}
    assert all(x["mod_type"] == "UPDATE" for x in second_rows)
    # idle: nothing new, the same offset comes back
    assert r.latestOffset(after, ReadAllAvailable()) == after


def test_a_merge_child_waits_for_both_parents(sdb: Database):
    r = reader(sdb)
    (root,) = sdb.partitions("S")
    low, high = sdb.split_partition("S", root.token)
    commit(sdb, list(range(10)))
    merged = sdb.merge_partitions("S", [low, high])
    commit(sdb, list(range(10)), value=2)
    start = r.initialOffset()
    offsets = [start]
    while True:
        nxt = r.latestOffset(offsets[-1], ReadAllAvailable())
        if nxt == offsets[-1]:
            break
        offsets.append(nxt)
    batches = [sorted(p.piece.token for p in r.partitions(a, b))
               for a, b in itertools.pairwise(offsets)]
    assert batches[0] == [root.token]
    merged_batch = next(i for i, b in enumerate(batches) if merged in b)
    assert all(low not in b and high not in b for b in batches[merged_batch:])
    assert any(low in b and high in b for b in batches[:merged_batch])
    total = sum(len(rows_of(r, a, b)) for a, b in itertools.pairwise(offsets))
    assert total == 20


def test_admission_control_never_splits_a_transaction(sdb: Database):
    r = reader(sdb, maxRecordsPerTrigger="5")
    assert r.getDefaultReadLimit() == ReadMaxRows(5)
    sizes = [3, 8, 1, 1, 1, 4, 2]
    stamps = [commit(sdb, list(range(100 * n, 100 * n + size))) for n, size in enumerate(sizes)]
    offset = r.initialOffset()
    batches = []
    while True:
        nxt = r.latestOffset(offset, ReadMaxRows(5))
        if nxt == offset:
            break
        rows = rows_of(r, offset, nxt)
        batches.append(sorted({row["server_transaction_id"] for row in rows}))
        per_txn: dict[str, int] = {}
        for row in rows:
            per_txn[row["server_transaction_id"]] = per_txn.get(row["server_transaction_id"], 0) + 1
        assert len(rows) <= 5 or len(per_txn) == 1, "only a lone big transaction may exceed"
        offset = nxt
    sizes_by_batch = [[sizes[int(t) - 1] for t in b] for b in batches]
    assert sizes_by_batch == [[3], [8], [1, 1, 1], [4], [2]]
    assert offset["timestamp"] == stamps[-1]
    everything = reader(sdb).latestOffset(r.initialOffset(), ReadAllAvailable())
    assert everything["timestamp"] == stamps[-1]


def test_admit_is_pure_and_keeps_timestamps_whole():
    assert admit([(10, 2), (10, 2), (20, 1)], 0, 30, 3) == 10
    assert admit([(10, 9)], 0, 30, 3) == 10
    assert admit([(10, 1), (20, 1)], 0, 30, 5) == 30
    with pytest.raises(InvalidArgument, match="at least 1"):
        admit([], 0, 1, 0)


def test_old_latest_offset_signature_and_available_now(sdb: Database):
    r = reader(sdb)
    commit(sdb, [1])
    r.prepareForTriggerAvailableNow()
    target = r.target
    commit(sdb, [2])  # after the target: availableNow must not read it
    end = r.latestOffset()
    assert end["timestamp"] == target
    assert r.latestOffset() == end


def test_start_outside_retention_and_bad_options(sdb: Database, clock):
    with pytest.raises(OutOfRange, match="earliest valid timestamp"):
        reader(sdb, startingTimestamp="2001-01-01T00:00:00Z").initialOffset()
    with pytest.raises(InvalidArgument, match="colour"):
        ChangeStreamSource({"database": sdb.path, "stream": "S", "colour": "red"})
    with pytest.raises(InvalidArgument, match="exactly one"):
        ChangeStreamSource({"database": sdb.path})
    from cdcflow.errors import NotFound
    with pytest.raises(NotFound, match="'Nope'"):
        ChangeStreamSource({"database": sdb.path, "stream": "Nope"})
    with pytest.raises(NotFound, match="'Missing'"):
        ChangeStreamSource({"database": sdb.path, "table": "Missing"})
    with pytest.raises(NotFound, match="does not exist"):
        ChangeStreamSource({"database": sdb.path + ".nope", "stream": "S"})
    with pytest.raises(InvalidArgument, match="maxrecordspertrigger"):
        reader(sdb, maxRecordsPerTrigger="0")


def test_position_that_fell_out_of_retention_is_a_clear_error(db_path: str, clock):
    db = Database.open(db_path, clock=clock)
    db.ddl("CREATE TABLE K (Id INT64 NOT NULL, V INT64) PRIMARY KEY (Id)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL OPTIONS (retention_period = '1h')")
    r = reader(db)
    start = r.initialOffset()
    clock.advance(timedelta(hours=2))
    with pytest.raises(OutOfRange, match="earliest valid timestamp"):
        r.latestOffset(start, ReadAllAvailable())


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=st.lists(st.sampled_from(["commit", "split", "merge"]), min_size=1, max_size=14))
def test_planning_over_live_partitions_equals_planning_over_the_whole_lineage(
        tmp_path_factory: pytest.TempPathFactory, steps: list[str]):
    """CS-4, goal 4 of issue 11: the reader plans from the partitions still active or ending
    after its position; frontier, batch end and slices equal those over every partition."""
    db = Database.open(tmp_path_factory.mktemp("lineage") / "l.db",
                       partition_policy=PartitionPolicy(auto=False))
    db.ddl("CREATE TABLE K (Id INT64 NOT NULL, V INT64) PRIMARY KEY (Id)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    moments = [commit(db, [0])]
    for number, step in enumerate(steps):
        active = [p for p in db.partitions("S") if p.state == "ACTIVE"]
        if step == "split":
            db.split_partition("S", active[number % len(active)].token)
        elif step == "merge" and len(active) > 1:
            ordered = sorted(active, key=lambda p: p.key_range.start)
            db.merge_partitions("S", [ordered[0].token, ordered[1].token])
        moments.append(commit(db, [number, number + 7]))
    options = parse_options({"database": db.path, "stream": "S"})
    everything = db.partitions("S")
    safe = to_micros(db.current_timestamp())
    edges = moments + [to_micros(t) for p in everything
                       for t in (p.start_timestamp, p.end_timestamp) if t is not None]
    for consumed in sorted({m + d for m in edges for d in (-3, -2, -1, 0, 1)}):
        live = db.partitions("S", ending_after=consumed + 1)
        assert len(live) <= len(everything)
        frontier = frontier_at(everything, consumed)
        assert frontier_at(live, consumed) == frontier
        offset = StreamOffset(consumed, frontier)
        end = batch_end(everything, offset, safe)
        assert batch_end(live, offset, safe) == end
        assert frontier_at(live, end) == frontier_at(everything, end)
        pieces = [p.piece for p in _slices(options, everything, consumed, end)]
        assert [p.piece for p in _slices(options, live, consumed, end)] == pieces
    if any(p.end_timestamp is not None for p in everything):  # the finished ones are left out
        assert len(db.partitions("S", ending_after=safe)) < len(everything)
