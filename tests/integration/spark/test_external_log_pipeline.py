"""A change log fed by the writer (as external sources feed it) goes through the Spark source
and the batch pipeline unchanged: rows carry the source block (read_method, source_timestamp,
source_metadata), events carry the source's EV-4 metadata and EV-6 sort keys, and the CDC
table equals the applied changes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from cdcflow.events.files import EventFileWriter, Rotation, read_json_events
from cdcflow.model.changes import SourceChange, SourceTransaction
from cdcflow.model.records import ColumnTypeInfo
from cdcflow.model.source import SourceMetadata, lsn_number
from cdcflow.model.timestamps import to_micros
from cdcflow.model.types import ColumnType
from cdcflow.spark.driver_batch import DriverReader, logged_batch_time, logged_offset
from cdcflow.spark.options import parse_options
from cdcflow.spark.pipeline import BatchPlan, EventsPlan, start_query
from cdcflow.store.changelog import ChangeLog
from cdcflow.table import CdcTable

pytestmark = pytest.mark.integration
TYPES = (ColumnTypeInfo("id", ColumnType("INT64"), True, 1),
         ColumnTypeInfo("owner", ColumnType("STRING"), False, 2),
         ColumnTypeInfo("balance", ColumnType("INT64"), False, 3))
OBJECT = "public.accounts"
T0 = datetime(2026, 5, 1, 8, 0, tzinfo=UTC)


def pg_transaction(number: int, changes: list[tuple[str, int, int | None]]) -> SourceTransaction:
    made = []
    for index, (kind, key, balance) in enumerate(changes):
        new = {} if kind == "DELETE" else {"owner": f"o{key}", "balance": balance}
        lsn = f"0/{(number * 100 + index):X}"
        made.append(SourceChange(OBJECT, kind, {"id": key}, new, {}, TYPES, "NEW_ROW",
                                 {"lsn": lsn}))
    metadata = SourceMetadata("postgres-cdc-wal", T0 + timedelta(seconds=number),
                              str(700 + number), {"commit_lsn": f"0/{number * 100 + 99:X}"})
    return SourceTransaction(metadata, tuple(made))


def test_an_appended_log_flows_through_spark_into_events_and_tables(spark, tmp_path: Path):
    log = ChangeLog.open(tmp_path / "pg.log", initial_partitions=2)
    log.ensure_change_stream("changes")
    history = [
        [("INSERT", 1, 10), ("INSERT", 2, 20), ("INSERT", 3, 30)],
        [("UPDATE", 1, 11), ("DELETE", 2, None)],
        [("INSERT", 2, 22), ("UPDATE", 2, 23), ("UPDATE", 3, 33)],
    ]
    position = None
    for number, changes in enumerate(history, start=1):
        log.append("pg", pg_transaction(number, changes), position, {"lsn": number})
        position = {"lsn": number}
    rows = (spark.read.format("cdcflow").option("database", str(tmp_path / "pg.log"))
            .option("stream", "changes").option("startingTimestamp", "earliest")
            .option("endingTimestamp", log.current_timestamp().isoformat()).load().collect())
    assert len(rows) == 8
    assert {r["read_method"] for r in rows} == {"postgres-cdc-wal"}
    first = min(rows, key=lambda r: (r["commit_timestamp"], r["record_sequence"]))
    assert first["source_timestamp"].replace(tzinfo=UTC) == T0 + timedelta(seconds=1)
    assert json.loads(first["source_metadata"])["tx_id"] == "701"
    assert "lsn" in json.loads(first["source_metadata"])

    table = CdcTable.create(tmp_path / "w" / OBJECT, "id INT64 NOT NULL, owner STRING(MAX), "
                            "balance INT64", ["id"])
    plan = BatchPlan("pg-shop", "shop", (OBJECT,), {OBJECT: str(table.root.resolve())},
                     "stream:pg-shop", EventsPlan(str(tmp_path / "events"), "json", Rotation()))
    manifests = tmp_path / "events" / "pg-shop" / "_manifests"
    unfinished = manifests / f".batch-000000000000.json.{'0' * 32}.tmp"
    manifests.mkdir(parents=True)
    unfinished.write_bytes(b'{"batch": "0')  # a driver killed inside a commit left it
    query = start_query(spark, plan, str(tmp_path / "pg.log"), "changes", "earliest",
                        tmp_path / "ckpt", {"availableNow": True})
    query.awaitTermination()
    assert query.exception() is None
    assert not unfinished.exists()  # the query's start removed it
    assert {r["id"]: (r["owner"], r["balance"]) for r in table.to_arrow().to_pylist()} == {
        1: ("o1", 11), 2: ("o2", 23), 3: ("o3", 33)}
    files = EventFileWriter(tmp_path / "events", "pg-shop").committed_files()
    events = [e for f in files for e in read_json_events(f)]
    assert len(events) == 8
    for event in events:
        assert event["read_method"] == "postgres-cdc-wal" and event["object"] == OBJECT
        metadata = event["source_metadata"]
        assert (metadata["schema"], metadata["table"]) == ("public", "accounts")
        assert set(metadata) == {"schema", "table", "tx_id", "lsn", "change_type",
                                 "is_deleted", "primary_keys"}  # EV-4 for PostgreSQL
        source_micros = int(datetime.fromisoformat(event["source_timestamp"]).timestamp()
                            * 1_000_000)
        assert event["sort_keys"] == [source_micros, lsn_number(metadata["lsn"])]  # EV-6
    ordered = sorted(events, key=lambda e: e["sort_keys"])
    assert [(e["source_metadata"]["change_type"], e["payload"]["id"]) for e in ordered] == [
        ("INSERT", "1"), ("INSERT", "2"), ("INSERT", "3"), ("UPDATE", "1"), ("DELETE", "2"),
        ("INSERT", "2"), ("UPDATE", "2"), ("UPDATE", "3")]
    deleted = next(e for e in ordered if e["source_metadata"]["is_deleted"])
    assert deleted["payload"] == {"id": "2", "owner": "o2", "balance": "20"}  # the whole row


WIDE = (*TYPES, ColumnTypeInfo("note", ColumnType("STRING"), False, 4))


def test_a_column_the_source_adds_reaches_the_table_from_many_partitions(spark,
                                                                        tmp_path: Path):
    """Every Spark partition that sees the new column reports it; the table gains it once."""
    log = ChangeLog.open(tmp_path / "pg.log", initial_partitions=4)
    log.ensure_change_stream("changes")
    log.append("pg", pg_transaction(1, [("INSERT", k, k) for k in range(40)]), None, {"n": 1})
    metadata = SourceMetadata("postgres-cdc-wal", T0 + timedelta(seconds=5), "9", {})
    wide = tuple(SourceChange(OBJECT, "UPDATE", {"id": k}, {"owner": f"o{k}", "balance": k,
                                                            "note": f"n{k}"}, {}, WIDE,
                              "NEW_ROW", {"lsn": f"0/{1000 + k:X}"}) for k in range(40))
    log.append("pg", SourceTransaction(metadata, wide), {"n": 1}, {"n": 2})
    table = CdcTable.create(tmp_path / "w" / OBJECT, "id INT64 NOT NULL, owner STRING(MAX), "
                            "balance INT64", ["id"])
    plan = BatchPlan("pg-shop", "shop", (OBJECT,), {OBJECT: str(table.root.resolve())},
                     "stream:pg-shop", driver_rows=0)  # the executors' path
    spark.conf.set("spark.sql.adaptive.enabled", "false")  # keep every shuffle partition
    try:
        query = start_query(spark, plan, str(tmp_path / "pg.log"), "changes", "earliest",
                            tmp_path / "ckpt", {"availableNow": True})
        query.awaitTermination()
    finally:
        spark.conf.unset("spark.sql.adaptive.enabled")
    assert query.exception() is None
    rows = {r["id"]: r for r in CdcTable.open(table.root).to_arrow().to_pylist()}
    assert rows == {k: {"id": k, "owner": f"o{k}", "balance": k, "note": f"n{k}"}
                    for k in range(40)}


def test_a_batch_replayed_after_its_events_committed_changes_nothing_twice(
        spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A crash between the event manifest and the table commits: the replay writes no event
    file again and folds the table rows from the tables as they were before the batch."""
    from cdcflow.spark import pipeline

    log = ChangeLog.open(tmp_path / "pg.log")
    log.ensure_change_stream("changes")
    log.append("pg", pg_transaction(1, [("INSERT", 1, 10)]), None, {"n": 1})
    log.append("pg", pg_transaction(2, [("UPDATE", 1, 11), ("DELETE", 1, None)]), {"n": 1},
               {"n": 2})
    table = CdcTable.create(tmp_path / "w" / OBJECT, "id INT64 NOT NULL, owner STRING(MAX), "
                            "balance INT64", ["id"])
    plan = BatchPlan("s", "shop", (OBJECT,), {OBJECT: str(table.root.resolve())}, "stream:s",
                     EventsPlan(str(tmp_path / "events"), "json", Rotation()))
    frame = (spark.read.format("cdcflow").option("database", str(tmp_path / "pg.log"))
             .option("stream", "changes").option("startingTimestamp", "earliest")
             .option("endingTimestamp", log.current_timestamp().isoformat()).load())

    def crash(*args: object, **kwargs: object) -> None:
        raise OSError("killed between the two commits")

    monkeypatch.setattr(pipeline, "commit_pending_files", crash)
    with pytest.raises(OSError):
        pipeline.run_batch(plan, frame, 0)
    monkeypatch.undo()
    writer = EventFileWriter(tmp_path / "events", "s")
    written = {f: f.read_bytes() for f in writer.committed_files()}
    first = next(iter(written))  # and a write of the batch killed beside it, left aside:
    aside = first.with_name(f".{first.name}.{'0' * 32}.tmp")
    aside.write_bytes(b"half")
    pipeline.run_batch(plan, frame, 0)  # the replay
    assert {f: f.read_bytes() for f in writer.committed_files()} == written
    assert len(list((tmp_path / "events" / "s").rglob("*.jsonl"))) == len(written)
    assert not aside.exists()  # the replay swept what the batch's attempts left
    events = [e for f in written for e in read_json_events(f)]
    delete = next(e for e in events if e["source_metadata"]["is_deleted"])
    assert delete["payload"] == {"id": "1", "owner": "o1", "balance": "11"}
    assert CdcTable.open(table.root).to_arrow().num_rows == 0


def run_into(spark, tmp_path: Path, log_path: Path, name: str, driver_rows: int
             ) -> tuple[dict, list[dict]]:
    table = CdcTable.create(tmp_path / name / OBJECT, "id INT64 NOT NULL, owner STRING(MAX), "
                            "balance INT64", ["id"])
    plan = BatchPlan("s", "shop", (OBJECT,), {OBJECT: str(table.root.resolve())}, "stream:s",
                     EventsPlan(str(tmp_path / name / "events"), "json", Rotation()),
                     driver_rows=driver_rows)
    query = start_query(spark, plan, str(log_path), "changes", "earliest",
                        tmp_path / name / "ckpt", {"availableNow": True}, max_records=25)
    query.awaitTermination()
    assert query.exception() is None
    rows = {r["id"]: r for r in CdcTable.open(table.root).to_arrow().to_pylist()}
    files = EventFileWriter(tmp_path / name / "events", "s").committed_files()
    for file in files:  # read when Spark planned the batch: the same in every attempt at it
        planned = logged_batch_time(tmp_path / name / "ckpt", int(file.name.split("-")[1]))
        assert planned is not None
        assert {e["read_timestamp"] for e in read_json_events(file)} == {
            planned.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"}
    events = [{k: v for k, v in e.items() if k != "read_timestamp"}
              for f in files for e in read_json_events(f)]
    return rows, sorted(events, key=lambda e: e["uuid"])


def test_small_batches_on_the_driver_equal_batches_through_the_executors(spark,
                                                                          tmp_path: Path):
    """Issue 11: the driver's path for small batches and the executors' path give the same
    CDC table and the same events (EV-4..6, AP-1), over many partitions and batches."""
    log = ChangeLog.open(tmp_path / "pg.log", initial_partitions=3)
    log.ensure_change_stream("changes")
    position = None
    for number in range(1, 31):
        kinds = ["INSERT", "UPDATE", "UPDATE", "DELETE"]
        changes = [(kinds[(number * 7 + k) % 4], (number * 5 + k * 3) % 17, number * 10 + k)
                   for k in range(1 + number % 4)]
        log.append("pg", pg_transaction(number, changes), position, {"n": number})
        position = {"n": number}
    executors = run_into(spark, tmp_path, tmp_path / "pg.log", "executors", driver_rows=0)
    driver = run_into(spark, tmp_path, tmp_path / "pg.log", "driver", driver_rows=10_000)
    assert executors[0] and len(executors[1]) == sum(1 + n % 4 for n in range(1, 31))
    assert driver == executors


def _parts(read: list[pa.RecordBatch] | int | None) -> list[pa.RecordBatch]:
    assert isinstance(read, list), read
    return read


def test_the_driver_reads_each_batch_spark_planned(spark, tmp_path: Path):
    """Issue 11: from Spark's offset log the driver reads, for every batch after the first,
    exactly the mods between the batch's two offsets: with the first batch, each mod of the
    log once. Spark's batch read of the whole log is the oracle."""
    log = ChangeLog.open(tmp_path / "pg.log", initial_partitions=3)
    log.ensure_change_stream("changes")
    for number in range(1, 21):
        changes = [("INSERT", number * 4 + k, k) for k in range(4)]
        log.append("pg", pg_transaction(number, changes),
                   {"n": number - 1} if number > 1 else None, {"n": number})
    run_into(spark, tmp_path, tmp_path / "pg.log", "driver", driver_rows=10_000)
    checkpoint = tmp_path / "driver" / "ckpt"
    options = parse_options({"database": str(tmp_path / "pg.log"), "stream": "changes",
                             "startingTimestamp": "earliest"})
    reader = DriverReader(str(checkpoint), options, limit=10_000)
    batches = sorted(int(p.name) for p in (checkpoint / "offsets").iterdir() if p.name.isdigit())
    first = logged_offset(checkpoint, 0)
    assert first is not None and len(batches) >= 3  # max_records=25 over 80 mods
    read = [(to_micros(r["commit_timestamp"].replace(tzinfo=UTC)), json.loads(r["keys"])["id"])
            for b in batches[1:] for part in _parts(reader.read(b)) for r in part.to_pylist()]
    everything = (spark.read.format("cdcflow").option("database", str(tmp_path / "pg.log"))
                  .option("stream", "changes").option("startingTimestamp", "earliest")
                  .option("endingTimestamp", log.current_timestamp().isoformat()).load()
                  .select("commit_timestamp", "keys").collect())
    logged = [(to_micros(r["commit_timestamp"].replace(tzinfo=UTC)), json.loads(r["keys"])["id"])
              for r in everything]
    assert len(logged) == 80
    assert sorted(read) == sorted(m for m in logged if m[0] > first.timestamp)
    second = reader.read(batches[1])
    assert isinstance(second, list) and sum(part.num_rows for part in second) > 3
    too_big = DriverReader(str(checkpoint), options, limit=3).read(batches[1])
    assert too_big == sum(part.num_rows for part in second)  # counted in the log, not read


def test_a_table_without_changes_in_a_batch_gets_no_commit_and_replays_stay_once(
        spark, tmp_path: Path):
    """Issue 11: each batch commits only the CDC tables it has changes for (a Delta commit
    costs ~20 ms and grows the log). A new query replaying a batch it wrote in full, or in
    part, still adds each table's rows once (AP-1)."""
    from cdcflow.spark import pipeline
    from cdcflow.table.pending import PendingLogs, pending_path

    log = ChangeLog.open(tmp_path / "pg.log")
    log.ensure_change_stream("changes")
    log.append("pg", pg_transaction(1, [("INSERT", 1, 10), ("INSERT", 2, 20)]), None, {"n": 1})
    busy = CdcTable.create(tmp_path / "w" / OBJECT, "id INT64 NOT NULL, owner STRING(MAX), "
                           "balance INT64", ["id"])
    idle = CdcTable.create(tmp_path / "w" / "public.idle", "id INT64 NOT NULL", ["id"])
    roots = {OBJECT: str(busy.root.resolve()), "public.idle": str(idle.root.resolve())}
    plan = BatchPlan("s", "shop", (OBJECT, "public.idle"), roots, "stream:s", None)
    frame = (spark.read.format("cdcflow").option("database", str(tmp_path / "pg.log"))
             .option("stream", "changes").option("startingTimestamp", "earliest")
             .option("endingTimestamp", log.current_timestamp().isoformat()).load())
    idle_log = Path(pending_path(roots["public.idle"])) / "_delta_log"
    commits_before = sorted(idle_log.glob("*.json"))
    logs = PendingLogs()
    assert pipeline.run_batch(plan, frame, 0, logs=logs)["rows"] == 2
    assert logs.ran_before(1) and not logs.ran_before(0)
    assert sorted(idle_log.glob("*.json")) == commits_before
    for _ in range(2):  # new queries replaying batch 0
        pipeline.run_batch(plan, frame, 0, logs=PendingLogs())
    assert busy.pending_row_count() == 2
    assert sorted(idle_log.glob("*.json")) == commits_before
    assert {r["id"]: r["balance"] for r in busy.to_arrow().to_pylist()} == {1: 10, 2: 20}
