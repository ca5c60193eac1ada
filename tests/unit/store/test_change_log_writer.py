"""The change-log writer: external source transactions appended with their position in one
log transaction, routed by key hash, readable by READ_<stream> (CS-5..9), split, merged and
expired like native records."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cdcflow import Database, FakeClock
from cdcflow.errors import FailedPrecondition, InvalidArgument, NotFound
from cdcflow.follow import follow_change_stream
from cdcflow.model.changes import SourceChange, SourceTransaction
from cdcflow.model.records import ColumnTypeInfo
from cdcflow.model.source import SourceMetadata
from cdcflow.model.types import ColumnType
from cdcflow.store.changelog import ChangeLog
from cdcflow.store.source_records import MAX_MODS_PER_RECORD

pytestmark = pytest.mark.unit

ACCOUNTS = (
    ColumnTypeInfo("id", ColumnType("INT64"), True, 1),
    ColumnTypeInfo("owner", ColumnType("STRING"), False, 2),
    ColumnTypeInfo("balance", ColumnType("INT64"), False, 3),
)
HISTORY = (  # no primary key
    ColumnTypeInfo("tid", ColumnType("INT64"), False, 1),
    ColumnTypeInfo("delta", ColumnType("INT64"), False, 2),
)
SOURCE_TIME = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def change(mod_type: str, key: int, balance: int | None = None, lsn: str = "0/10",
           table: str = "public.accounts") -> SourceChange:
    new = {} if mod_type == "DELETE" else {"owner": f"o{key}", "balance": balance}
    old = {"owner": f"o{key}", "balance": 0} if mod_type == "DELETE" else {}
    return SourceChange(table, mod_type, {"id": key}, new, old, ACCOUNTS,
                        "NEW_ROW_AND_OLD_VALUES", {"lsn": lsn})


def transaction(*changes: SourceChange, tx_id: str = "700") -> SourceTransaction:
    metadata = SourceMetadata("postgres-cdc-wal", SOURCE_TIME, tx_id, {"commit_lsn": "0/99"})
    return SourceTransaction(metadata, tuple(changes))


@pytest.fixture
def changelog(tmp_path: Path) -> ChangeLog:
    opened = ChangeLog.open(tmp_path / "pg.log", initial_partitions=2)
    opened.ensure_change_stream("changes")
    return opened


def data_records(log: ChangeLog, stream: str = "changes") -> list[Any]:
    start = log.earliest_readable(stream)
    result = follow_change_stream(log, stream, start, log.current_timestamp())
    return sorted(result.records, key=lambda r: (r.commit_timestamp, r.record_sequence))


def test_append_writes_records_with_source_block_and_position_atomically(changelog: ChangeLog):
    tx = transaction(change("INSERT", 1, 10, "0/11"), change("INSERT", 2, 20, "0/12"))
    at = changelog.append("pg", tx, None, {"lsn": "0/99"})
    records = data_records(changelog)
    assert {r.commit_timestamp for r in records} == {at}
    assert sum(len(r.mods) for r in records) == 2
    assert {r.server_transaction_id for r in records} == {records[0].server_transaction_id}
    for record in records:
        assert record.source == tx.metadata  # the block travels in the log body
        assert record.number_of_records_in_transaction == len(records)
        assert record.to_dict()["source"]["tx_id"] == "700"
    positions = sorted(m.position["lsn"] for r in records for m in r.mods)
    assert positions == ["0/11", "0/12"]
    stored = changelog.position("pg")
    assert stored is not None and stored.position == {"lsn": "0/99"}
    assert stored.source_timestamp == SOURCE_TIME and stored.appended_at == at


def test_append_many_gives_each_transaction_its_own_commit_and_stores_the_last_position(
        changelog: ChangeLog):
    batch = [transaction(change("INSERT", 1, 10), tx_id="701"),
             transaction(change("UPDATE", 1, 11), change("INSERT", 2, 20), tx_id="702"),
             transaction(change("DELETE", 1), tx_id="703")]
    times = changelog.append_many("pg", batch, None, {"lsn": "0/99"})
    assert times == sorted(set(times)) and len(times) == 3  # strictly increasing
    records = data_records(changelog)
    by_tx = {r.source.tx_id: r.commit_timestamp for r in records}
    assert by_tx == {"701": times[0], "702": times[1], "703": times[2]}
    assert sum(len(r.mods) for r in records) == 4
    stored = changelog.position("pg")
    assert stored is not None and stored.position == {"lsn": "0/99"}
    assert stored.appended_at == times[-1]


def test_append_many_writes_nothing_when_one_transaction_is_bad(changelog: ChangeLog):
    bad = transaction(change("UPSERT", 2, 1), tx_id="702")  # not a mod type
    with pytest.raises(InvalidArgument, match="UPSERT"):
        changelog.append_many("pg", [transaction(change("INSERT", 1, 1)), bad], None,
                              {"lsn": "0/2"})
    with pytest.raises(InvalidArgument, match="at least one"):
        changelog.append_many("pg", [], None, {"lsn": "0/2"})
    with pytest.raises(FailedPrecondition, match="another capture worker"):
        changelog.append_many("pg", [transaction(change("INSERT", 1, 1))], {"lsn": "0/1"},
                              {"lsn": "0/2"})
    assert data_records(changelog) == [] and changelog.position("pg") is None


def test_changes_are_routed_by_key_hash_like_native_commits(tmp_path: Path):
    log = ChangeLog.open(tmp_path / "x.log", initial_partitions=4)
    log.ensure_change_stream("changes")
    log.append("pg", transaction(*[change("INSERT", k, k) for k in range(40)]), None, {"n": 1})
    (parents,) = {tuple(p.token for p in log.partitions("changes"))}
    seen: dict[int, set[str]] = {}
    for token in parents:
        for row in log.read_change_stream("changes", log.earliest_readable("changes"),
                                          log.current_timestamp(), token, 1000):
            for mod in (row.data_change_record.mods if row.data_change_record else ()):
                seen.setdefault(mod.keys["id"], set()).add(token)
    assert sorted(seen) == list(range(40))
    assert all(len(tokens) == 1 for tokens in seen.values())
    assert len({t for tokens in seen.values() for t in tokens}) > 1  # spread over partitions


def test_source_order_of_one_key_survives_record_grouping(changelog: ChangeLog):
    """INSERT, DELETE, INSERT of one key in one transaction: ordering by (record_sequence,
    mod index) must replay them in source order, so the row exists at the end."""
    tx = transaction(change("INSERT", 5, 1), change("DELETE", 5), change("INSERT", 5, 3))
    changelog.append("pg", tx, None, {"n": 1})
    records = data_records(changelog)
    replay = [(r.mod_type, m.new_values.get("balance")) for r in records for m in r.mods]
    assert replay == [("INSERT", 1), ("DELETE", None), ("INSERT", 3)]
    sequences = [int(r.record_sequence) for r in records]
    assert sequences == sorted(set(sequences))


def test_long_runs_are_cut_into_bounded_records(changelog: ChangeLog):
    count = MAX_MODS_PER_RECORD * 2 + 5
    changelog.append("pg", transaction(*[change("INSERT", k, k) for k in range(count)]), None,
                     {"n": 1})
    records = data_records(changelog)
    assert all(len(r.mods) <= MAX_MODS_PER_RECORD for r in records)
    assert sum(len(r.mods) for r in records) == count


def test_keyless_tables_are_accepted_and_spread(changelog: ChangeLog):
    rows = [SourceChange("public.history", "INSERT", {}, {"tid": i, "delta": i}, {}, HISTORY,
                         position={"lsn": f"0/{i:X}"}) for i in range(30)]
    changelog.append("pg", transaction(*rows), None, {"n": 1})
    records = data_records(changelog)
    assert sorted(m.new_values["tid"] for r in records for m in r.mods) == list(range(30))
    assert all(m.keys == {} for r in records for m in r.mods)


def test_a_stale_after_position_writes_nothing(changelog: ChangeLog):
    changelog.append("pg", transaction(change("INSERT", 1, 1)), None, {"lsn": "0/1"})
    with pytest.raises(FailedPrecondition, match="another capture worker"):
        changelog.append("pg", transaction(change("INSERT", 2, 2)), None, {"lsn": "0/2"})
    with pytest.raises(FailedPrecondition, match="0/1"):
        changelog.advance("pg", {"lsn": "0/0"}, {"lsn": "0/3"})
    assert sum(len(r.mods) for r in data_records(changelog)) == 1
    changelog.advance("pg", {"lsn": "0/1"}, {"lsn": "0/3"})
    position = changelog.position("pg")
    assert position is not None and position.position == {"lsn": "0/3"}
    assert position.source_timestamp == SOURCE_TIME  # kept from the last transaction


BAD = [
    (lambda c: SourceChange(c.table, "UPSERT", c.keys, c.new_values, {}, ACCOUNTS),
     "mod_type 'UPSERT'"),
    (lambda c: SourceChange(c.table, "INSERT", {}, c.new_values, {}, ACCOUNTS),
     "exactly its primary key"),
    (lambda c: SourceChange(c.table, "INSERT", {"id": None}, c.new_values, {}, ACCOUNTS),
     "hold NULL"),
    (lambda c: SourceChange(c.table, "INSERT", c.keys, {"balance": "12"}, {}, ACCOUNTS),
     "'12' of column 'balance'"),
    (lambda c: SourceChange(c.table, "INSERT", c.keys, {"nope": 1}, {}, ACCOUNTS),
     "'nope'"),
    (lambda c: SourceChange(c.table, "INSERT", c.keys, {"id": 1}, {}, ACCOUNTS),
     "belongs in keys"),
    (lambda c: SourceChange(c.table, "DELETE", c.keys, {"balance": 1}, {}, ACCOUNTS),
     "DELETE has no new values"),
    (lambda c: SourceChange(c.table, "INSERT", c.keys, {}, {"balance": 1}, ACCOUNTS),
     "INSERT has no old values"),
    (lambda c: SourceChange("", "INSERT", c.keys, {}, {}, ACCOUNTS), "non-empty name"),
    (lambda c: SourceChange(c.table, "INSERT", c.keys, {}, {}, ACCOUNTS, "ALL"),
     "value_capture_type 'ALL'"),
    (lambda c: SourceChange(c.table, "INSERT", c.keys, {}, {}, ACCOUNTS + ACCOUNTS[:1]),
     "twice"),
    (lambda c: SourceChange(c.table, "INSERT", c.keys, {}, {}, ACCOUNTS),  # no LSN (EV-6)
     "needs an 'lsn'"),
    (lambda c: SourceChange(c.table, "INSERT", c.keys, {}, {}, ACCOUNTS, position={"lsn": "x"}),
     "LSN 'x'"),
    (lambda c: SourceChange(c.table, "INSERT", c.keys, {}, {}, ACCOUNTS,
                            position={"lsn": "0/1", "at": SOURCE_TIME}), "is not JSON"),
]


@pytest.mark.parametrize(("mutate", "needle"), BAD)
def test_bad_changes_raise_typed_errors_and_write_nothing(changelog: ChangeLog, mutate: Any,
                                                          needle: str):
    good = change("INSERT", 1, 1)
    with pytest.raises(InvalidArgument, match=needle) as raised:
        changelog.append("pg", transaction(good, mutate(good)), None, {"n": 1})
    assert "change 1 of transaction '700'" in str(raised.value)
    assert data_records(changelog) == [] and changelog.position("pg") is None


@pytest.mark.parametrize(("metadata", "needle"), [
    (SourceMetadata("oracle-cdc-logminer", SOURCE_TIME, "1"), "is not one of"),
    (SourceMetadata("postgres-cdc-wal", datetime(2026, 1, 1), "1"),  # noqa: DTZ001 naive
     "no timezone"),
])
def test_bad_source_blocks_are_refused(changelog: ChangeLog, metadata: SourceMetadata,
                                       needle: str):
    with pytest.raises(InvalidArgument, match=needle):
        changelog.append("pg", SourceTransaction(metadata, (change("INSERT", 1, 1),)), None, {})
    with pytest.raises(InvalidArgument, match="at least one change"):
        changelog.append("pg", SourceTransaction(transaction().metadata, ()), None, {})
    assert changelog.position("pg") is None


def test_a_backfill_transaction_is_taken_with_its_read_method(changelog: ChangeLog):
    """Rows of a table backfilled again while the stream goes on come through the log, as
    `postgresql-backfill` (EV-3), in the same atomic append as the source position."""
    metadata = SourceMetadata("postgresql-backfill", SOURCE_TIME, "request-1", {})
    rows = tuple(SourceChange("public.accounts", "INSERT", {"id": k},
                              {"owner": f"o{k}", "balance": k}, {}, ACCOUNTS, "NEW_ROW",
                              {"lsn": "0/20"}) for k in (1, 2))
    changelog.append("pg", SourceTransaction(metadata, rows), None, {"again": 1})
    records = data_records(changelog)
    assert {r.source.read_method for r in records} == {"postgresql-backfill"}
    assert sorted(m.keys["id"] for r in records for m in r.mods) == [1, 2]
    assert changelog.position("pg").position == {"again": 1}


def test_split_merge_and_retention_work_on_an_appended_log(tmp_path: Path):
    clock = FakeClock(datetime(2026, 3, 1, tzinfo=UTC))
    log = ChangeLog.open(tmp_path / "x.log", clock=clock)
    log.ensure_change_stream("changes", retention_period="1h")
    position: dict[str, Any] | None = None
    for batch in range(3):
        new = {"n": batch}
        log.append("pg", transaction(*[change("UPDATE", k, batch) for k in range(10)]),
                   position, new)
        position = new
        (active,) = [p for p in log.partitions("changes") if p.state == "ACTIVE"][:1]
        if batch == 0:
            log.split_partition("changes", active.token)
        elif batch == 1:
            low, high = [p.token for p in log.partitions("changes") if p.state == "ACTIVE"]
            log.merge_partitions("changes", [low, high])
        clock.advance(timedelta(minutes=1))
    records = data_records(log)
    assert [sorted(m.new_values["balance"] for r in records
                   if r.commit_timestamp == stamp for m in r.mods)
            for stamp in sorted({r.commit_timestamp for r in records})] == [
        [b] * 10 for b in range(3)]
    clock.advance(timedelta(hours=2))
    assert log.enforce_retention()["change_records"] > 0
    assert log.position("pg") is not None  # positions outlive the records they follow


def test_an_appended_log_serves_the_shard_api(changelog: ChangeLog):
    """SH-6 over a log fed by the writer: the appended table's stream, shards, iterators."""
    changelog.append("pg", transaction(change("INSERT", 9, 90)), None, {"n": 1})
    with pytest.raises(NotFound, match=r"'public\.nope'"):
        changelog.update_table("public.nope", enable_stream=True)
    stream_id = str(changelog.update_table("public.accounts", enable_stream=True))
    changelog.append("pg", transaction(change("INSERT", 3, 30), change("UPDATE", 9, 91)),
                     {"n": 1}, {"n": 2})
    shards = changelog.describe_stream(stream_id).shards
    seen = []
    for shard in shards:
        records, _ = changelog.get_stream_record(
            changelog.get_shard_iterator(stream_id, shard.shard_id))
        seen += [(r.action_type, r.primary_key["id"], r.columns["balance"]) for r in records]
    assert sorted(seen) == [("PUT_ROW", 3, 30), ("UPDATE_ROW", 9, 91)]  # from enabling on


def test_the_writer_refuses_a_database_s_own_tables(tmp_path: Path):
    """A table of the embedded database gets its records from its own commits (CS-1)."""
    db = Database.open(tmp_path / "shop.db")
    db.ddl("CREATE TABLE K (id INT64 NOT NULL, owner STRING(MAX), balance INT64) "
           "PRIMARY KEY (id)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    with pytest.raises(InvalidArgument, match=r"table 'K' is a table of this database"):
        db.append("pg", transaction(change("INSERT", 3, 30, table="K")), None, {"n": 1})
    assert db.position("pg") is None and data_records(db, "S") == []


def test_a_file_of_the_first_release_opens_and_takes_appends(tmp_path: Path):
    """tests/data/log_format_1.db was written by the release before the format was
    versioned (see make_log_format_1.py); it opens, reads, and is upgraded in place."""
    path = tmp_path / "old.db"
    path.write_bytes((Path(__file__).parents[2] / "data" / "log_format_1.db").read_bytes())
    (last,) = sqlite3.connect(path).execute(
        "SELECT value FROM _meta WHERE key = 'last_commit_micros'").fetchone()
    clock = FakeClock(datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=last + 60e6))
    db = Database.open(path, clock=clock, create=False)
    assert db.tables() == ["Accounts"] and db.change_streams() == ["Everything"]
    assert sorted(r["Id"] for r in db.scan("Accounts")) == [0, 1, 3, 4, 5]
    records = data_records(db, "Everything")
    assert [r.mod_type for r in records] == ["INSERT"] * 6 + ["UPDATE", "DELETE"]
    assert all(r.source is None for r in records)
    assert records[0].source_metadata.read_method == "embedded-cdc-changestream"
    (stream_id,) = [s.stream_id for s in db.list_streams()]
    (shard,) = db.describe_stream(stream_id).shards
    assert len(db.get_stream_record(db.get_shard_iterator(stream_id, shard.shard_id))[0]) == 8
    with db.transaction() as tx:
        tx.insert("Accounts", {"Id": 9, "Owner": "new", "Balance": 1})
    db.append("pg", transaction(change("INSERT", 10, 1, table="Accounts2")), None, {"n": 1})
    assert db.position("pg") is not None
    (version,) = sqlite3.connect(path).execute(
        "SELECT value FROM _meta WHERE key = 'log_format'").fetchone()
    assert version == 5  # the newest format: column types stored once, journaled commits
    # the old records keep their whole bodies; the new one names its column types
    kept = sqlite3.connect(path).execute(
        "SELECT types IS NULL, COUNT(*) FROM _log WHERE kind = 0 GROUP BY 1").fetchall()
    assert kept == [(0, 3), (1, 16)]  # two streams; both new Accounts records share a row
    assert sqlite3.connect(path).execute("SELECT COUNT(*) FROM _column_types").fetchone() == (2,)
    clock.advance(timedelta(seconds=1))
    records = data_records(db, "Everything")
    assert [r.table_name for r in records[-2:]] == ["Accounts", "Accounts2"]
    assert [r.mods[0].keys for r in records[-2:]] == [{"Id": 9}, {"id": 10}]
    assert records[-2].column_types == records[0].column_types


def test_a_newer_format_is_refused_and_a_foreign_file_is_not_touched(tmp_path: Path):
    path = tmp_path / "new.db"
    Database.open(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE _meta SET value = 99 WHERE key = 'log_format'")
    with pytest.raises(FailedPrecondition, match="log format 99"):
        Database.open(path, create=False)
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE t (x)")
    with pytest.raises(FailedPrecondition, match="not a cdcflow database"):
        ChangeLog.open(foreign, create=False)
    tables = {n for (n,) in sqlite3.connect(foreign).execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"t"}


def test_a_failure_after_the_records_are_written_rolls_back_records_and_position(
        changelog: ChangeLog, monkeypatch: pytest.MonkeyPatch):
    """Records and position are one transaction: a failure in between leaves neither."""
    from cdcflow.store import log

    def broken(*args: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(log, "write_position", broken)
    with pytest.raises(OSError, match="disk full"):
        changelog.append("pg", transaction(change("INSERT", 1, 1)), None, {"n": 1})
    monkeypatch.undo()
    assert data_records(changelog) == [] and changelog.position("pg") is None
    changelog.append("pg", transaction(change("INSERT", 1, 1)), None, {"n": 1})
    assert len(data_records(changelog)) == 1


def test_mysql_changes_need_their_binlog_position(changelog: ChangeLog):
    metadata = SourceMetadata("mysql-cdc-binlog", SOURCE_TIME, "g:1", {"log_file": "b.000001"})
    good = SourceChange("shop.accounts", "INSERT", {"id": 1}, {}, {}, ACCOUNTS,
                        position={"log_position": 120})
    bad = SourceChange("shop.accounts", "INSERT", {"id": 2}, {}, {}, ACCOUNTS,
                       position={"log_position": "120"})
    with pytest.raises(InvalidArgument, match=r"change 1 .*'log_position'"):
        changelog.append("my", SourceTransaction(metadata, (good, bad)), None, {"n": 1})
    changelog.append("my", SourceTransaction(metadata, (good,)), None, {"n": 1})
    (record,) = data_records(changelog)
    assert record.source_metadata.read_method == "mysql-cdc-binlog"
