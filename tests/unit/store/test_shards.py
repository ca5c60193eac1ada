"""The shard/iterator API (SH-1..7) over the same per-partition log."""

from __future__ import annotations

from datetime import timedelta

import pytest

from cdcflow import Database, FakeClock, PartitionPolicy
from cdcflow.errors import InvalidArgument, NotFound, OutOfRange

pytestmark = pytest.mark.unit

TABLE = "CREATE TABLE K (Id INT64 NOT NULL, V INT64) PRIMARY KEY (Id)"


def test_enable_list_describe_and_page_through_a_shard(db: Database):
    """SH-2 (and SH-6): a read takes a shard iterator and returns at most `limit` records
    and the next iterator, paging through the shard's log."""
    db.ddl(TABLE)
    stream_id = db.update_table("K", enable_stream=True, expiration_time=timedelta(hours=24))
    assert stream_id is not None
    assert [s.stream_id for s in db.list_streams()] == [stream_id]
    assert db.list_streams(table="Other") == []
    assert db.change_streams() == []  # the shard stream is internal
    with db.transaction() as tx:
        for i in range(5):
            tx.insert("K", {"Id": i, "V": i})
    with db.transaction() as tx:
        tx.update("K", {"Id": 0, "V": 100})
        tx.delete("K", {"Id": 1})
    (shard,) = db.describe_stream(stream_id).shards
    assert shard.parent_id is None and shard.parent_sibling_id is None
    iterator = db.get_shard_iterator(stream_id, shard.shard_id)
    seen = []
    for _ in range(10):
        records, iterator = db.get_stream_record(iterator, limit=2)
        assert len(records) <= 2
        seen.extend(records)
        if not records:
            break
    assert [r.action_type for r in seen] == ["PUT_ROW"] * 5 + ["UPDATE_ROW", "DELETE_ROW"]
    assert seen[5].primary_key == {"Id": 0} and seen[5].columns == {"V": 100}
    assert seen[5].old_columns == {"V": 0}
    assert iterator is not None  # an active shard never ends


def test_finished_shard_ends_with_empty_iterator_and_children_name_parents(db: Database):
    db.ddl(TABLE)
    stream_id = db.update_table("K", enable_stream=True)
    with db.transaction() as tx:
        tx.insert("K", {"Id": 1})
    change_stream = db._catalog().streams
    (name,) = [n for n in change_stream if n.startswith("__shard_K")]
    (root,) = db.partitions(name)
    low, high = db.split_partition(name, root.token)
    merged = db.merge_partitions(name, [low, high])
    iterator = db.get_shard_iterator(stream_id, root.token)
    records, nxt = db.get_stream_record(iterator)
    assert len(records) == 1 and nxt is None  # SH-7: read to its end
    shards = {s.shard_id: s for s in db.describe_stream(stream_id).shards}
    assert shards[low].parent_id == root.token and shards[low].parent_sibling_id is None
    assert (shards[merged].parent_id, shards[merged].parent_sibling_id) == (low, high)


def test_disable_and_reenable_starts_at_the_new_offset(db: Database):
    """SH-3: disabling and re-enabling a stream starts it from the log offset at the new
    enable time: changes from before it (or from the old stream) are not in it."""
    db.ddl(TABLE)
    first = db.update_table("K", enable_stream=True)
    with db.transaction() as tx:
        tx.insert("K", {"Id": 1})
    assert db.update_table("K", enable_stream=False) is None
    assert db.list_streams() == []
    with pytest.raises(NotFound, match=str(first)):
        db.describe_stream(str(first))
    with db.transaction() as tx:
        tx.insert("K", {"Id": 2})
    second = db.update_table("K", enable_stream=True)
    assert second != first
    with db.transaction() as tx:
        tx.insert("K", {"Id": 3})
    (shard,) = db.describe_stream(str(second)).shards
    records, _ = db.get_stream_record(db.get_shard_iterator(str(second), shard.shard_id))
    assert [r.primary_key["Id"] for r in records] == [3]


def test_expiration_and_bad_arguments(fake_db: Database, clock: FakeClock):
    db = fake_db
    db.ddl(TABLE)
    stream_id = str(db.update_table("K", enable_stream=True, expiration_time=timedelta(hours=1)))
    with db.transaction() as tx:
        tx.insert("K", {"Id": 1})
    (shard,) = db.describe_stream(stream_id).shards
    stale = db.get_shard_iterator(stream_id, shard.shard_id)
    clock.advance(timedelta(hours=2))
    db.enforce_retention()  # the record the iterator points at is removed unread
    with pytest.raises(OutOfRange, match="get_shard_iterator again"):
        db.get_stream_record(stale)
    fresh = db.get_shard_iterator(stream_id, shard.shard_id)
    assert db.get_stream_record(fresh)[0] == []
    with pytest.raises(InvalidArgument, match="limit 0"):
        db.get_stream_record(fresh, limit=0)
    with pytest.raises(InvalidArgument, match="not a valid iterator"):
        db.get_stream_record("garbage!")
    with pytest.raises(InvalidArgument, match="1 hour to 30 days"):
        db.update_table("K", enable_stream=True, expiration_time=timedelta(minutes=5))
    with pytest.raises(NotFound, match="'Missing'"):
        db.update_table("Missing", enable_stream=True)
    with pytest.raises(NotFound, match="'nope'"):
        db.get_shard_iterator(stream_id, "nope")
    db.update_table("K", enable_stream=True, expiration_time=timedelta(hours=5))
    assert db.describe_stream(stream_id).expiration_time == timedelta(hours=5)


def test_an_expired_finished_shard_still_ends_and_is_not_named_as_a_parent(
    fake_db: Database, clock: FakeClock
):
    """SH-5/SH-7: retention removes the child record that ended a shard; the shard must still
    read as ended, and its children must not point at a shard describe_stream hides."""
    db = fake_db
    db.set_partition_policy(PartitionPolicy(auto=False))
    db.ddl(TABLE)
    stream_id = str(db.update_table("K", enable_stream=True, expiration_time=timedelta(hours=1)))
    (name,) = [n for n in db._catalog().streams if n.startswith("__shard_K")]
    with db.transaction() as tx:
        tx.insert("K", {"Id": 1})
    (root,) = db.partitions(name)
    low, high = db.split_partition(name, root.token)
    clock.advance(timedelta(hours=2))
    with db.transaction() as tx:
        tx.insert("K", {"Id": 2})
    db.enforce_retention()  # the commit above may have expired them already (throttled GC)
    conn = db._session().conn
    assert conn.execute("SELECT COUNT(*) FROM _log WHERE token = ?", (root.token,)).fetchone() \
        == (0,)  # the data and the child record that ended the shard are gone
    iterator = db.get_shard_iterator(stream_id, root.token)
    assert db.get_stream_record(iterator) == ([], None)
    shards = {s.shard_id: s for s in db.describe_stream(stream_id).shards}
    assert root.token not in shards
    assert shards[low].parent_id is None and shards[high].parent_id is None
    seen = []
    for shard in (low, high):
        records, following = db.get_stream_record(db.get_shard_iterator(stream_id, shard))
        seen += [r.primary_key["Id"] for r in records]
        assert following is not None  # active shards do not end
    assert seen == [2]


def test_a_reader_behind_removed_records_is_told_so(fake_db: Database, clock: FakeClock):
    db = fake_db
    db.ddl(TABLE)
    stream_id = str(db.update_table("K", enable_stream=True, expiration_time=timedelta(hours=1)))
    (shard,) = db.describe_stream(stream_id).shards
    with db.transaction() as tx:
        tx.insert("K", {"Id": 1})
    with db.transaction() as tx:
        tx.insert("K", {"Id": 2})
    first, iterator = db.get_stream_record(db.get_shard_iterator(stream_id, shard.shard_id), 1)
    assert [r.primary_key["Id"] for r in first] == [1] and iterator is not None
    fresh = db.get_shard_iterator(stream_id, shard.shard_id)
    clock.advance(timedelta(minutes=30))
    assert [r.primary_key["Id"] for r in db.get_stream_record(iterator)[0]] == [2]
    clock.advance(timedelta(hours=1))
    db.enforce_retention()
    with pytest.raises(OutOfRange, match="get_shard_iterator again"):
        db.get_stream_record(iterator)  # record 2 was never read and is gone
    with pytest.raises(OutOfRange):
        db.get_stream_record(fresh)


def test_a_reader_stopped_inside_a_removed_commit_is_told_so(fake_db: Database,
                                                            clock: FakeClock):
    db = fake_db
    db.ddl(TABLE)
    stream_id = str(db.update_table("K", enable_stream=True, expiration_time=timedelta(hours=1)))
    (shard,) = db.describe_stream(stream_id).shards
    with db.transaction() as tx:
        for i in range(3):
            tx.insert("K", {"Id": i})
    first, iterator = db.get_stream_record(db.get_shard_iterator(stream_id, shard.shard_id), 1)
    assert len(first) == 1 and iterator is not None  # two mods of that commit are unread
    clock.advance(timedelta(hours=2))
    db.enforce_retention()
    with pytest.raises(OutOfRange, match="removed unread"):
        db.get_stream_record(iterator)


def test_a_fresh_iterator_on_an_old_busy_shard_reads(fake_db: Database, clock: FakeClock):
    """A record that was inside the expiration when the iterator was made, and passed it
    before the read (a slow reader), but was not removed, is read rather than refused."""
    db = fake_db
    db.set_partition_policy(PartitionPolicy(auto=False))
    db.ddl(TABLE)
    stream_id = str(db.update_table("K", enable_stream=True, expiration_time=timedelta(hours=1)))
    (shard,) = db.describe_stream(stream_id).shards
    with db.transaction() as tx:
        tx.insert("K", {"Id": 5})
    clock.advance(timedelta(hours=1) - timedelta(seconds=1))
    fresh = db.get_shard_iterator(stream_id, shard.shard_id)
    clock.advance(timedelta(seconds=2))  # now the record is past the expiration, still kept
    records, following = db.get_stream_record(fresh)
    assert [r.primary_key["Id"] for r in records] == [5] and following is not None


def test_enabling_records_the_current_offset_and_an_iterator_is_a_position(db: Database):
    """SH-2: enabling a stream records the log offset of that moment, so changes committed
    before it (kept in the log for another stream) are not in it; an iterator marks a
    position in a shard's log, so reading it again returns the same records."""
    db.ddl(TABLE)
    db.ddl("CREATE CHANGE STREAM Everything FOR ALL")
    with db.transaction() as tx:
        tx.insert("K", {"Id": 1})
    stream_id = str(db.update_table("K", enable_stream=True))
    for number in (2, 3, 4):
        with db.transaction() as tx:
            tx.insert("K", {"Id": number})
    (shard,) = db.describe_stream(stream_id).shards
    first, middle = db.get_stream_record(db.get_shard_iterator(stream_id, shard.shard_id), 1)
    assert [r.primary_key["Id"] for r in first] == [2] and middle is not None
    again, following = db.get_stream_record(middle, 5)
    assert [r.primary_key["Id"] for r in again] == [3, 4]
    assert db.get_stream_record(middle, 5) == (again, following)
    assert following is not None and db.get_stream_record(following)[0] == []
