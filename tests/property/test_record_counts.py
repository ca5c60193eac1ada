"""Partition record counts (CS-5's splits and merges; `cdcflow.store.log.count_records`):
every insert and expiry keeps `_partitions.records` equal to the rows the partition holds in
`_log`, so the partition policy reads its counts instead of counting the log each second.
Random operations (commits settled at once or late, the policy's own splits and merges,
splits and merges by hand, retention after hours pass, appended source transactions) leave
every partition's count equal to a count of its records after each step."""

from __future__ import annotations

import sqlite3
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow import Database, PartitionPolicy
from cdcflow.clock import FakeClock
from cdcflow.model.changes import SourceChange, SourceTransaction
from cdcflow.model.records import ColumnTypeInfo
from cdcflow.model.source import SourceMetadata
from cdcflow.model.types import ColumnType
from cdcflow.store.changelog import ChangeLog

pytestmark = pytest.mark.property

POLICY = PartitionPolicy(split_records=3, max_partitions=4, merge_min_age_seconds=1.0,
                         merge_max_records_per_second=0.5, check_interval_seconds=0.001)

steps = st.lists(st.one_of(
    st.tuples(st.just("commit"), st.lists(st.integers(0, 40), min_size=1, max_size=5)),
    st.tuples(st.just("commit"), st.lists(st.integers(0, 40), min_size=1, max_size=5)),
    st.tuples(st.just("read"), st.just(0)),
    st.tuples(st.just("split"), st.integers(0, 3)),
    st.tuples(st.just("merge"), st.integers(0, 3)),
    st.tuples(st.just("wait"), st.sampled_from([1, 30, 2 * 3600])),
    st.tuples(st.just("append"), st.lists(st.integers(0, 40), min_size=1, max_size=4)),
), min_size=1, max_size=20)


def _mismatches(path: Path) -> list[tuple[str, str, int, int]]:
    """Partitions whose kept count differs from a count of their records."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(
            "SELECT p.stream, p.token, p.records, (SELECT COUNT(*) FROM _log AS l "
            "WHERE l.stream = p.stream AND l.token = p.token) AS counted FROM _partitions AS p "
            "WHERE p.records != counted").fetchall()
    finally:
        conn.close()


def _apply(db: Database, log: ChangeLog, clock: FakeClock, step: tuple[str, Any],
           number: int) -> None:
    kind, argument = step
    clock.advance(timedelta(milliseconds=700))
    if kind == "commit":
        with db.transaction() as tx:
            for key in argument:
                tx.insert_or_update("Orders", {"Id": key, "Amount": number})
    elif kind == "read":
        db.current_timestamp()  # settles the journal
    elif kind == "wait":
        clock.advance(timedelta(seconds=argument))
        db.enforce_retention()
    elif kind == "append":
        current = log.position("pg")
        log.append_many("pg", [_transaction(argument, number, clock)],
                        None if current is None else current.position, {"n": number})
    else:
        _by_hand(db, kind, argument)


def _by_hand(db: Database, kind: str, argument: int) -> None:
    active = sorted((p for p in db.partitions("S") if p.end_timestamp is None),
                    key=lambda p: p.key_range.start)
    if kind == "split":
        db.split_partition("S", active[argument % len(active)].token)
    elif len(active) > 1:
        index = argument % (len(active) - 1)
        db.merge_partitions("S", [active[index].token, active[index + 1].token])


COLUMNS = (ColumnTypeInfo("id", ColumnType("INT64"), True, 1),
           ColumnTypeInfo("v", ColumnType("INT64"), False, 2))


def _transaction(keys: list[int], number: int, clock: FakeClock) -> SourceTransaction:
    metadata = SourceMetadata("postgres-cdc-wal", clock.now().astimezone(UTC), str(number),
                              {"commit_lsn": f"0/{number + 1:X}"})
    return SourceTransaction(metadata, tuple(
        SourceChange("public.items", "INSERT", {"id": key}, {"v": number}, {}, COLUMNS,
                     "NEW_ROW", {"lsn": f"0/{number + 1:X}"}) for key in keys))


@settings(max_examples=50, deadline=None)
@given(steps)
def test_every_partition_count_equals_the_records_it_holds(run: list[tuple[str, Any]]):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "counts.db"
        clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
        db = Database.open(path, clock=clock, partition_policy=POLICY)
        db.ddl(["CREATE TABLE Orders (Id INT64 NOT NULL, Amount INT64) PRIMARY KEY (Id)",
                "CREATE CHANGE STREAM S FOR ALL OPTIONS (retention_period = '1h')"])
        log = ChangeLog.open(path, clock=clock)
        log.ensure_change_stream("changes", retention_period="1h")
        for number, step in enumerate(run):
            _apply(db, log, clock, step, number)
            assert _mismatches(path) == [], (number, step)
        db.current_timestamp()
        assert _mismatches(path) == []
        log.close()
        db.close()


def test_a_file_whose_counts_were_not_kept_is_counted_when_a_writer_opens_it(tmp_path: Path):
    path = tmp_path / "old.db"
    db = Database.open(path, partition_policy=PartitionPolicy(auto=False))
    db.ddl(["CREATE TABLE Orders (Id INT64 NOT NULL, Amount INT64) PRIMARY KEY (Id)",
            "CREATE CHANGE STREAM S FOR ALL"])
    for key in range(5):
        with db.transaction() as tx:
            tx.insert("Orders", {"Id": key, "Amount": key})
    db.current_timestamp()
    db.close()
    conn = sqlite3.connect(path)
    with conn:  # as a cdcflow that did not keep counts left it
        conn.execute("UPDATE _partitions SET records = 0")
        conn.execute("DELETE FROM _meta WHERE key = 'record_counts'")
    conn.close()
    assert len(_mismatches(path)) == 1
    Database.open(path).close()
    assert _mismatches(path) == []
