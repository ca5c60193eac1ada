"""Secondary indexes of the embedded database (issue 13, CW-3/4/5/7): a NULL_FILTERED index
on (ShardId, LastModified) kept inside every commit, polls through it with a (timestamp,
key) cursor and a shard predicate, SQLite's plan showing the index in use, processed rows
leaving the index and coming back, and typed errors for bad definitions."""

from __future__ import annotations

from datetime import timedelta

import pytest

from cdcflow import COMMIT_TIMESTAMP, Database
from cdcflow.capture.watcher.config import WatchedTable
from cdcflow.capture.watcher.embedded import EmbeddedTarget
from cdcflow.errors import AlreadyExists, DdlError, InvalidArgument, NotFound
from tests.unit.store.test_generated_columns import SINGERS, shard_of

pytestmark = pytest.mark.unit
INDEX = "CREATE NULL_FILTERED INDEX SingersByShard ON Singers (ShardId, LastModified)"
ALL_SHARDS = [list(range(-18, 19))]


def write(db: Database, first: int, count: int) -> None:
    with db.transaction() as tx:
        for number in range(first, first + count):
            tx.insert_or_update("Singers", {
                "SingerId": number, "FirstName": f"f{number}", "LastName": f"l{number}",
                "LastModified": COMMIT_TIMESTAMP})


def poll_all(db: Database, prefix: list[list[int]], page: int) -> list[int]:
    """Every row through the index, page by page with the (timestamp, key) cursor."""
    seen, after = [], None
    while True:
        found = db.poll_index("SingersByShard", prefix, after=after, limit=page)
        seen += [p.row["SingerId"] for p in found]
        assert len(seen) <= 1000, "the cursor does not move on"
        if len(found) < page:
            return seen
        after = (found[-1].cursor, found[-1].key)


def test_polls_page_through_equal_timestamps_and_filter_shards(db: Database):
    db.ddl([SINGERS, INDEX])
    write(db, 1, 50)  # one commit: 50 rows with one timestamp, across page boundaries
    write(db, 51, 7)
    assert sorted(poll_all(db, ALL_SHARDS, 3)) == list(range(1, 58))
    assert len(poll_all(db, ALL_SHARDS, 3)) == 57  # none twice
    some = [s for s in range(-18, 19) if s % 3 == 0]
    picked = poll_all(db, [some], 4)
    assert sorted(picked) == [n for n in range(1, 58) if shard_of(f"f{n}", f"l{n}") in some]
    assert picked and len(picked) < 57
    newest = db.poll_index("SingersByShard", ALL_SHARDS, limit=100)[-1]
    assert db.poll_index("SingersByShard", ALL_SHARDS, after=(newest.cursor, newest.key)) == []
    cutoff = newest.cursor - timedelta(microseconds=1)
    assert {p.row["SingerId"] for p in db.poll_index("SingersByShard", ALL_SHARDS,
                                                     up_to=cutoff)} == set(range(1, 51))


def test_the_plan_uses_the_index_with_the_shard_predicate(db: Database):
    db.ddl([SINGERS, INDEX])
    write(db, 1, 20)
    plan = " | ".join(db.explain_poll("SingersByShard", [[-1, 0, 1]], after=(0, ""),
                                      limit=10))
    assert "USING COVERING INDEX" in plan and "c0=?" in plan, plan
    assert "SCAN" not in plan.replace("SCAN CONSTANT", ""), plan


def test_processed_rows_leave_the_index_and_an_update_brings_them_back(db: Database):
    db.ddl([SINGERS, INDEX])
    write(db, 1, 5)
    with db.transaction() as tx:
        tx.update("Singers", {"SingerId": 2, "Processed": True})
        tx.delete("Singers", {"SingerId": 3})
    assert sorted(poll_all(db, ALL_SHARDS, 10)) == [1, 4, 5]
    with db.transaction() as tx:
        tx.update("Singers", {"SingerId": 2, "Processed": False,
                              "LastModified": COMMIT_TIMESTAMP})
    assert sorted(poll_all(db, ALL_SHARDS, 10)) == [1, 2, 4, 5]
    with db.transaction() as tx:  # no timestamp: NULL_FILTERED leaves it out too
        tx.insert("Singers", {"SingerId": 9, "FirstName": "a", "LastName": "b"})
    assert 9 not in poll_all(db, ALL_SHARDS, 10)


def test_an_index_made_on_a_table_with_rows_is_filled_and_dropped_with_it(db: Database):
    db.ddl(SINGERS)
    write(db, 1, 4)
    db.ddl(INDEX)
    assert sorted(poll_all(db, ALL_SHARDS, 2)) == [1, 2, 3, 4]
    db.ddl("CREATE INDEX ByTime ON Singers (LastModified)")
    assert [p.row["SingerId"] for p in db.poll_index("ByTime", limit=10)] == [1, 2, 3, 4]
    db.ddl("DROP INDEX ByTime")
    with pytest.raises(NotFound, match="index 'ByTime' does not exist"):
        db.poll_index("ByTime")
    db.ddl("DROP TABLE Singers")
    with pytest.raises(NotFound, match="SingersByShard"):
        db.poll_index("SingersByShard")


@pytest.mark.parametrize(("ddl", "error", "needle"), [
    ("CREATE INDEX I ON Singers (Nope)", DdlError, "'Nope' is not a column"),
    ("CREATE INDEX I ON Nowhere (A)", NotFound, "Nowhere"),
    ("CREATE INDEX I ON Singers (ShardId, ShardId)", DdlError, "repeats a column"),
    ("CREATE INDEX SingersByShard ON Singers (FirstName)", AlreadyExists, "exists already"),
    ("CREATE NULL_FILTERED INDEX I ON Singers ShardId", DdlError, "expected '('"),
    ("CREATE INDEX I ON Singers (ShardId); DROP TABLE Singers", DdlError, "end of statement"),
])
def test_bad_index_definitions_are_typed_errors(db: Database, ddl: str, error: type,
                                                needle: str):
    db.ddl([SINGERS, INDEX])
    with pytest.raises(error) as raised:
        db.ddl(ddl)
    assert needle in str(raised.value)
    assert db.table_schema("Singers").name == "Singers"


def test_bad_polls_are_typed_errors(db: Database):
    db.ddl([SINGERS, INDEX])
    with pytest.raises(InvalidArgument, match="every index column but the last"):
        db.poll_index("SingersByShard")
    with pytest.raises(InvalidArgument, match="limit 0 must be at least 1"):
        db.poll_index("SingersByShard", ALL_SHARDS, limit=0)


def test_cleanup_nulls_old_timestamps_in_batches_beside_a_writer_of_other_rows(
        db: Database, tmp_path):
    """CW-6: old rows leave the index when a partitioned update sets their commit timestamp
    to NULL; a concurrent writer that keeps to other rows (the documented rule) loses
    nothing, and a row written again after the cutoff is not cleaned."""
    import multiprocessing

    db.ddl([SINGERS, INDEX])
    write(db, 1, 300)
    cutoff = db.current_timestamp() + timedelta(microseconds=1)  # after the 300 rows
    writer = multiprocessing.get_context("spawn").Process(
        target=_write_new_rows, args=(db.path, 1000, 200))
    writer.start()
    write(db, 5, 1)  # written after the cutoff: no longer the cleanup's
    changed = db.partitioned_update("Singers", {"LastModified": None}, "LastModified",
                                    cutoff, batch_rows=64)
    writer.join(timeout=120)
    assert writer.exitcode == 0 and changed == 299
    left = set(poll_all(db, ALL_SHARDS, 100))
    assert left == {5, *range(1000, 1200)}
    assert db.read_row("Singers", 1)["LastModified"] is None
    with pytest.raises(InvalidArgument, match="not a TIMESTAMP"):
        db.partitioned_update("Singers", {"Processed": True}, "FirstName", cutoff)
    with pytest.raises(InvalidArgument, match="cannot set key columns"):
        db.partitioned_update("Singers", {"SingerId": 3}, "LastModified", cutoff)


def _write_new_rows(path: str, first: int, count: int) -> None:
    database = Database.open(path)
    for number in range(first, first + count):
        write(database, number, 1)
    database.close()


def test_a_file_from_before_indexes_still_opens_for_reading(db: Database):
    """A reader that opens a file without initialising it (the Spark source does) must not
    fail on a file made before the _indexes table existed."""
    import sqlite3

    from cdcflow.store.catalog import load_catalog

    db.ddl(SINGERS)
    conn = sqlite3.connect(db.path)
    conn.execute("DROP TABLE _indexes")
    catalog = load_catalog(conn, 1)
    conn.close()
    assert catalog.indexes == {} and "Singers" in catalog.tables


def test_a_sharded_watcher_polls_through_the_index_with_the_shard_column_first(db: Database):
    """CW-2: an index on the commit timestamp alone (or with it first) is a write hot spot;
    the watcher of a sharded table polls through the index that has the shard column first,
    and never through a timestamp-first one (it scans instead)."""
    db.ddl([SINGERS, "CREATE INDEX ByTime ON Singers (LastModified)",
            "CREATE INDEX ByTimeThenShard ON Singers (LastModified, ShardId)", INDEX])
    write(db, 1, 5)
    sharded = WatchedTable("Singers", "LastModified", "ShardId", tuple(range(-18, 19)))
    target = EmbeddedTarget(db.path)
    try:
        chosen = target.index_for(sharded)
        assert chosen == "SingersByShard"
        (index,) = [i for i in db.indexes() if i.name == chosen]
        assert index.columns[0] == "ShardId"
        assert target.index_for(WatchedTable("Singers", "LastModified")) == "ByTime"
        page = target.poll(sharded, [0, ""], target.horizon(), 100)
        assert sorted(p.row["SingerId"] for p in page.rows) == [1, 2, 3, 4, 5]
        db.ddl("DROP INDEX SingersByShard")
        assert target.index_for(sharded) is None
    finally:
        target.close()
