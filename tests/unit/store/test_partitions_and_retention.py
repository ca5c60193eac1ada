"""Partitions (CS-2, CS-4, CS-9), tailing with heartbeats (CS-8), retention (CS-5, SH-1)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from cdcflow import Database, FakeClock, PartitionPolicy
from cdcflow.errors import FailedPrecondition, InvalidArgument, NotFound, OutOfRange

pytestmark = pytest.mark.unit

TABLE = "CREATE TABLE K (Id INT64 NOT NULL, V INT64) PRIMARY KEY (Id)"


def test_split_then_merge_lineage_and_child_records(db: Database):
    db.ddl(TABLE)
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    (root,) = db.partitions("S")
    low, high = db.split_partition("S", root.token)
    merged = db.merge_partitions("S", [high, low])
    by_token = {p.token: p for p in db.partitions("S")}
    assert by_token[root.token].state == "FINISHED"
    assert by_token[root.token].child_tokens == (low, high)
    assert by_token[low].parent_tokens == (root.token,)
    assert by_token[merged].parent_tokens == (low, high)
    assert by_token[merged].key_range == root.key_range
    assert by_token[merged].state == "ACTIVE" and by_token[merged].end_timestamp is None
    assert by_token[low].end_timestamp == by_token[merged].start_timestamp
    start = by_token[root.token].start_timestamp
    end = db.current_timestamp()
    (child_low,) = [r.child_partitions_record for r in
                    db.read_change_stream("S", start, end, low, 1000)]
    (child_high,) = [r.child_partitions_record for r in
                     db.read_change_stream("S", start, end, high, 1000)]
    assert child_low == child_high  # both parents return the same record (CS-9)
    assert child_low.child_partitions[0].token == merged
    assert child_low.child_partitions[0].parent_partition_tokens == (low, high)
    assert child_low.start_timestamp == by_token[merged].start_timestamp


def test_manual_split_and_merge_errors(db: Database):
    db.ddl(TABLE)
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    (root,) = db.partitions("S")
    with pytest.raises(InvalidArgument, match="strictly inside"):
        db.split_partition("S", root.token, at=0)
    with pytest.raises(NotFound, match="'nope'"):
        db.split_partition("S", "nope")
    a, b = db.split_partition("S", root.token)
    with pytest.raises(FailedPrecondition, match="finished"):
        db.split_partition("S", root.token)
    a1, a2 = db.split_partition("S", a)
    with pytest.raises(FailedPrecondition, match="not adjacent"):
        db.merge_partitions("S", [a1, b])
    with pytest.raises(InvalidArgument, match="exactly 2"):
        db.merge_partitions("S", [a1, a2, b])
    with pytest.raises(NotFound, match="'Nope'"):
        db.partitions("Nope")


def test_records_follow_keys_into_child_partitions(db: Database):
    db.ddl(TABLE)
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    start = db.current_timestamp()
    with db.transaction() as tx:
        for i in range(50):
            tx.insert("K", {"Id": i, "V": i})
    (root,) = db.partitions("S")
    low, high = db.split_partition("S", root.token)
    with db.transaction() as tx:
        for i in range(50):
            tx.update("K", {"Id": i, "V": -i})
    end = db.current_timestamp()
    seen: dict[str, set[int]] = {}
    for token in (root.token, low, high):
        for row in db.read_change_stream("S", start, end, token, 1000):
            if row.data_change_record:
                for mod in row.data_change_record.mods:
                    seen.setdefault(token, set()).add(mod.keys["Id"])
    assert seen[root.token] == set(range(50))
    assert seen[low] | seen[high] == set(range(50))
    assert not seen[low] & seen[high]
    ranges = {p.token: p.key_range for p in db.partitions("S")}
    for token in (low, high):
        assert all(ranges[token].contains(db.key_hash("K", i)) for i in seen[token])


def test_automatic_split_and_merge(db_path: str):
    policy = PartitionPolicy(split_records=5, max_partitions=4, merge_min_age_seconds=0.0,
                             merge_max_records_per_second=1e9, check_interval_seconds=0.0)
    clock = FakeClock()
    db = Database.open(db_path, clock=clock, partition_policy=policy)
    db.ddl(TABLE)
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    for i in range(40):
        with db.transaction() as tx:
            tx.insert("K", {"Id": i})
        clock.advance(timedelta(milliseconds=10))
    partitions = db.partitions("S")
    assert len(partitions) > 1
    assert sum(p.state == "ACTIVE" for p in partitions) <= 4
    assert any(len(p.parent_tokens) == 2 for p in partitions), "a merge happened"
    assert any(len(p.parent_tokens) == 1 for p in partitions), "a split happened"
    db.set_partition_policy(PartitionPolicy(auto=False))
    assert not Database.open(db_path).partition_policy.auto


def test_tailing_query_heartbeats_then_ends_at_split(fake_db: Database, clock: FakeClock):
    db = fake_db
    db.ddl(TABLE)
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    (root,) = db.partitions("S")
    start = root.start_timestamp
    with db.transaction() as tx:
        tx.insert("K", {"Id": 1})
    rows = db.read_change_stream("S", start, None, root.token, 1000)
    first = next(rows)
    assert first.data_change_record is not None
    beat = next(rows)  # idle: the fake clock moves while the reader polls
    assert beat.heartbeat_record is not None
    assert beat.heartbeat_record.timestamp >= first.data_change_record.commit_timestamp
    later = next(rows)
    assert later.heartbeat_record is not None and later.timestamp > beat.timestamp
    with db.transaction() as tx:
        tx.insert("K", {"Id": 2})
    assert tx.commit_timestamp > later.timestamp
    db.split_partition("S", root.token)
    kinds = []
    for row in rows:
        kinds.append("data" if row.data_change_record else
                     "heartbeat" if row.heartbeat_record else "child")
    assert kinds[-1] == "child" and "data" in kinds


def test_tailing_query_wakes_up_for_a_commit_from_another_thread(db: Database):
    db.ddl(TABLE)
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    (root,) = db.partitions("S")

    def write_later() -> None:
        other = Database.open(db.path)
        with other.transaction() as tx:
            tx.insert("K", {"Id": 99})

    timer = threading.Timer(0.3, write_later)
    timer.start()
    rows = db.read_change_stream("S", root.start_timestamp, None, root.token, 1000)
    first = next(rows)
    assert first.data_change_record is not None
    assert first.data_change_record.mods[0].keys == {"Id": 99}
    timer.join()


def test_retention_removes_old_records_and_rejects_old_starts(fake_db: Database, clock: FakeClock):
    db = fake_db
    db.ddl(TABLE)
    db.ddl("CREATE CHANGE STREAM S FOR ALL OPTIONS (retention_period = '1h')")
    (root,) = db.partitions("S")
    with db.transaction() as tx:
        tx.insert("K", {"Id": 1})
    old = tx.commit_timestamp
    clock.advance(timedelta(minutes=90))
    with db.transaction() as tx:
        tx.insert("K", {"Id": 2})
    db.enforce_retention()  # the commit above may already have expired it (throttled GC)
    conn = db._session().conn
    assert conn.execute("SELECT COUNT(*) FROM _log WHERE kind = 0").fetchone()[0] == 1
    with pytest.raises(OutOfRange) as caught:
        db.read_change_stream("S", old, None, root.token, 1000)
    earliest = clock.now() - timedelta(hours=1)
    assert earliest.strftime("%Y-%m-%dT%H:%M:%S") in str(caught.value)
    rows = list(db.read_change_stream("S", earliest, db.current_timestamp(), root.token, 1000))
    assert [r.data_change_record.mods[0].keys["Id"] for r in rows] == [2]
    with pytest.raises(OutOfRange, match="version retention"):
        db.scan("K", read_timestamp=old)


def test_scan_at_a_timestamp_is_a_consistent_snapshot(db: Database):
    db.ddl(TABLE)
    with db.transaction() as tx:
        tx.insert("K", {"Id": 1, "V": 1})
        tx.insert("K", {"Id": 2, "V": 2})
    at = db.current_timestamp()
    with db.transaction() as tx:
        tx.update("K", {"Id": 1, "V": 10})
        tx.delete("K", {"Id": 2})
        tx.insert("K", {"Id": 3, "V": 3})
    then = sorted((r["Id"], r["V"]) for r in db.scan("K", read_timestamp=at))
    now = sorted((r["Id"], r["V"]) for r in db.scan("K"))
    assert then == [(1, 1), (2, 2)]
    assert now == [(1, 10), (3, 3)]
    half = 1 << 61
    parts = db.scan("K", key_hash_range=(0, half)) + db.scan("K", key_hash_range=(half, 1 << 62))
    assert sorted(r["Id"] for r in parts) == [1, 3]
    assert db.read_row("K", 2, read_timestamp=at) == {"Id": 2, "V": 2}


def test_bounded_query_whose_end_is_past_returns_without_waiting(
    fake_db: Database, clock: FakeClock
):
    """CS-5: after all records up to `end` the query ends; with `end` already past it must
    not sit out a heartbeat interval first (the fake clock moves only when the reader waits)."""
    db = fake_db
    db.ddl(TABLE)
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    (root,) = db.partitions("S")
    with db.transaction() as tx:
        tx.insert("K", {"Id": 1})
    clock.advance(timedelta(seconds=5))
    end = clock.now() - timedelta(seconds=1)
    before = clock.now()
    rows = list(db.read_change_stream("S", root.start_timestamp, end, root.token, 4000))
    assert [r.data_change_record is not None for r in rows] == [True]
    assert clock.now() == before
    with db.transaction() as tx:
        tx.insert("K", {"Id": 2})
    assert tx.commit_timestamp > end  # closing the past end did not move commits into it


@pytest.mark.parametrize("bad", [12345, 1.5, b"2026-01-01", ["2026-01-01T00:00:00Z"]])
def test_a_parameter_that_is_not_a_timestamp_is_invalid_argument(db: Database, bad: object):
    db.ddl(TABLE)
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    with pytest.raises(InvalidArgument, match="is not a timestamp"):
        db.read_change_stream("S", bad, None, None, 1000)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="is not a timestamp"):
        list(db.execute_sql(
            "SELECT ChangeRecord FROM READ_S(start_timestamp => @s, heartbeat_milliseconds "
            "=> 1000)", {"s": bad}))
    with pytest.raises(InvalidArgument, match="is not a timestamp"):
        db.scan("K", read_timestamp=bad)  # type: ignore[arg-type]


def test_query_of_a_partition_that_ended_before_start_gives_children_from_start(db: Database):
    """CS-9: a child record's start_timestamp lies between the query's start and end."""
    db.ddl(TABLE)
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    (root,) = db.partitions("S")
    low, high = db.split_partition("S", root.token)
    with db.transaction() as tx:
        tx.insert("K", {"Id": 1})
    start = tx.commit_timestamp
    end = db.current_timestamp()
    (row,) = list(db.read_change_stream("S", start, end, root.token, 1000))
    record = row.child_partitions_record
    assert record is not None
    assert start <= record.start_timestamp <= end
    assert {c.token for c in record.child_partitions} == {low, high}


@pytest.mark.parametrize("watched", [False, True])
def test_commits_remove_row_versions_past_the_retention_with_or_without_a_stream(
        fake_db: Database, clock: FakeClock, watched: bool):
    """Writers remove superseded row versions older than the version retention (at most
    every 10 s), whether or not a change stream watches the table: before, only commits
    that wrote a journal row did, so a database without a stream kept every version."""
    db = fake_db
    db.ddl(TABLE)
    if watched:
        db.ddl("CREATE CHANGE STREAM S FOR ALL")
    for value in range(5):
        with db.transaction() as tx:
            tx.insert_or_update("K", {"Id": 1, "V": value})
    storage = db._session().catalog.storage("K")

    def versions() -> int:
        conn = db._session().conn
        return int(conn.execute(f"SELECT COUNT(*) FROM {storage}").fetchone()[0])

    assert versions() == 5
    clock.advance(timedelta(hours=2))
    with db.transaction() as tx:
        tx.insert_or_update("K", {"Id": 2, "V": 0})
    assert versions() == 2  # key 1's newest version and key 2's
    assert db.read_row("K", 1) == {"Id": 1, "V": 4}
