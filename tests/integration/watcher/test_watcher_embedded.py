"""The polling change watcher on the embedded database (issue 13, CW-1..7): backfill, then
rounds of polls through the NULL_FILTERED (ShardId, LastModified) index while writer
processes commit and others hold transactions open for a while before committing; the
capture worker is SIGKILLed mid-way. At the end the rows rebuilt from the snapshot and the
change log equal the table, and no commit is appended twice."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cdcflow import COMMIT_TIMESTAMP, Database
from cdcflow.follow import follow_change_stream
from cdcflow.store.changelog import open_log
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.sources import open_source
from cdcflow.streams.workers import run_capture
from tests.unit.store.test_generated_columns import SINGERS

pytestmark = pytest.mark.integration
INDEX = "CREATE NULL_FILTERED INDEX SingersByShard ON Singers (ShardId, LastModified)"


def writer(path: str, seed: int, count: int, hold_seconds: float) -> None:
    """Upserts of random singers; with `hold_seconds`, each transaction waits that long
    between its writes and its commit (its timestamp is taken at commit)."""
    rng = random.Random(seed)
    database = Database.open(path)
    for _ in range(count):
        tx = database.transaction()
        for _ in range(rng.randint(1, 3)):
            number = rng.randrange(400)
            tx.insert_or_update("Singers", {
                "SingerId": number, "FirstName": f"f{rng.randrange(50)}",
                "LastName": f"l{number}", "LastModified": COMMIT_TIMESTAMP,
                "Processed": False})  # CW-7: an update sets it back to false
        if hold_seconds:
            time.sleep(rng.uniform(0, hold_seconds))
        tx.commit()
    database.close()


def definition(tmp_path: Path, db_path: str) -> StreamDefinition:
    return StreamDefinition.parse({
        "name": "watch", "source": {
            "kind": "watcher", "target": {"kind": "embedded", "database": db_path},
            "tables": [{"name": "Singers", "commit_timestamp_column": "LastModified",
                        "shard_column": "ShardId", "shard_values": [-18, 18]}],
            "poll_interval_seconds": 0.5, "page_rows": 50},
        "destinations": [{"kind": "event_files", "root": str(tmp_path / "events")}]})


def start_worker(stream: StreamDefinition, home: Path) -> Any:
    process = multiprocessing.get_context("spawn").Process(
        target=run_capture, args=(stream.model_dump_json(), str(home / "catalog.db")))
    process.start()
    return process


def test_the_watcher_misses_nothing_under_writers_and_a_kill(tmp_path: Path):
    db_path = str(tmp_path / "shop.db")
    database = Database.open(db_path)
    database.ddl([SINGERS, INDEX])
    writer(db_path, 1, 60, 0)
    stream = definition(tmp_path, db_path)
    home = tmp_path / "home"
    source = open_source(stream, home)
    objects = source.discover()
    snapshot = source.snapshot(objects, None)
    rows: dict[int, dict[str, Any]] = {}
    source.backfill(snapshot, objects, lambda item, chunk, after: rows.update(
        {r["SingerId"]: r for r in chunk}))
    source.release(snapshot)
    worker = start_worker(stream, home)
    writers = [multiprocessing.get_context("spawn").Process(
        target=writer, args=(db_path, seed, 150, hold)) for seed, hold in
        ((2, 0), (3, 0), (4, 0.3), (5, 0.3))]
    for process in writers:
        process.start()
    log = open_log(source.log_location()[0])
    deadline = time.monotonic() + 60
    while not (log.position(source.source_id) or {}) or len(changes(log, snapshot)) < 40:
        assert time.monotonic() < deadline, "the watcher appended nothing"
        time.sleep(0.05)
    os.kill(worker.pid, signal.SIGKILL)
    worker.join()
    worker = start_worker(stream, home)
    for process in writers:
        process.join(timeout=300)
        assert process.exitcode == 0
    mark = source.mark()
    deadline = time.monotonic() + 60
    while not source.reached(log, mark):
        assert time.monotonic() < deadline, "the watcher did not reach the mark"
        time.sleep(0.05)
    worker.terminate()
    worker.join()
    appended = changes(log, snapshot)
    for change in appended:
        rows[change["SingerId"]] = change
    assert rows == {r["SingerId"]: r for r in database.scan("Singers")}
    doubled = Counter((c["SingerId"], c["LastModified"]) for c in appended)
    assert max(doubled.values()) == 1, "a row version was appended twice"
    assert len({c["ShardId"] for c in appended}) > 30  # through many shards of the index
    database.close()


def changes(log: Any, snapshot: Any) -> list[dict[str, Any]]:
    if log.current_timestamp() < snapshot.cdc_start:
        return []
    records = follow_change_stream(log, "changes", snapshot.cdc_start,
                                   log.current_timestamp()).records
    records.sort(key=lambda r: (r.commit_timestamp, int(r.record_sequence)))
    return [keys | new for r in records for keys, new, _ in r.decoded_mods()]



def test_a_watcher_stream_through_the_runner_fills_its_cdc_table(spark: Any, tmp_path: Path):
    import yaml

    from cdcflow.streams.catalog import Catalog
    from cdcflow.table import CdcTable
    from tests.integration.mysql.test_mysql_rebackfill import start_runner
    from tests.integration.postgres.test_postgres_stream import cli, wait

    db_path = str(tmp_path / "shop.db")
    database = Database.open(db_path)
    database.ddl([SINGERS, INDEX])
    writer(db_path, 1, 40, 0)
    spec = tmp_path / "watch.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "watch", "source": definition(tmp_path, db_path).source.model_dump(),
        "destinations": [{"kind": "cdc_table", "warehouse": str(tmp_path / "warehouse")},
                         {"kind": "event_files", "root": str(tmp_path / "events"),
                          "format": "avro"}],
        "spark": {"trigger_seconds": 0.3}}))
    catalog_path = tmp_path / "catalog.db"
    cli(catalog_path, "create", str(spec))
    cli(catalog_path, "start", "watch")
    catalog = Catalog(catalog_path)
    stop, thread = start_runner(catalog_path, spark)
    try:
        wait(lambda: catalog.get("watch").state.value == "RUNNING", "RUNNING", 180)
        writer(db_path, 2, 60, 0)
        cli(catalog_path, "drain", "watch")
        wait(lambda: catalog.get("watch").state.value == "PAUSED", "PAUSED", 180)
    finally:
        stop.set()
        thread.join(timeout=120)
    table = CdcTable.open(tmp_path / "warehouse" / "Singers").to_arrow().to_pylist()
    assert {r["SingerId"]: r for r in table} == {
        r["SingerId"]: r for r in database.scan("Singers")}
    from cdcflow.model.timestamps import to_micros
    from tests.integration.mysql.test_mysql_rebackfill import avro_events

    events = avro_events(tmp_path / "events", "watch")
    polled = [e for e in events if e.read_method == "watcher-cdc-poll"]
    assert polled and all(  # (commit timestamp, primary key); Avro keeps millis
        (e.sort_keys[0] // 1000, e.sort_keys[1]) == (
            to_micros(e.source_timestamp) // 1000, f"[{e.payload['SingerId']}]")
        for e in polled)
    assert {e.read_method for e in events} == {"watcher-cdc-poll", "watcher-backfill-scan"}
    assert all(e.source_metadata["versions_seen"] >= 1 for e in polled)
    database.close()


def test_a_soft_delete_column_turns_a_polled_row_into_a_delete(tmp_path: Path):
    """Hard deletes are invisible to polling; a row polled with its soft-delete column true
    is logged as a DELETE of its key, and one set back to false as the row again."""
    from cdcflow.capture.watcher.config import (
        EmbeddedTargetConfig,
        WatchedTable,
        WatcherConfig,
    )
    from cdcflow.capture.watcher.source import Poller, WatcherSource

    db_path = str(tmp_path / "shop.db")
    database = Database.open(db_path)
    database.ddl(["CREATE TABLE Items (Id INT64 NOT NULL, Name STRING(MAX), Deleted BOOL, "
                  "LastModified TIMESTAMP OPTIONS (allow_commit_timestamp = true)) "
                  "PRIMARY KEY (Id)"])
    source = WatcherSource(WatcherConfig(EmbeddedTargetConfig(db_path), (WatchedTable(
        "Items", "LastModified", soft_delete_column="Deleted"),), str(tmp_path / "log.db")))
    snapshot = source.snapshot(source.discover(), None)
    source.release(snapshot)
    log = open_log(source.log_location()[0])
    poller = Poller(source, log, log.position(source.source_id).position)
    logged = []
    for deleted in (False, True, False):
        with database.transaction() as tx:
            tx.insert_or_update("Items", {"Id": 1, "Name": f"n{deleted}", "Deleted": deleted,
                                          "LastModified": COMMIT_TIMESTAMP})
        poller.round()
        records = follow_change_stream(log, "changes", snapshot.cdc_start,
                                       log.current_timestamp()).records
        logged = [(r.mod_type, keys, new) for r in records for keys, new, _ in
                  r.decoded_mods()]
    assert [(m, k) for m, k, _ in logged] == [("UPDATE", {"Id": 1}), ("DELETE", {"Id": 1}),
                                               ("UPDATE", {"Id": 1})]
    assert logged[1][2] == {} and logged[2][2]["Name"] == "nFalse"
    source.close()
    database.close()


def test_changes_between_two_polls_collapse_and_count_their_versions(tmp_path: Path):
    """Three commits of one row between two rounds arrive as one event of its last state
    that says it stands for 3 versions; a row changed once says 1."""
    from cdcflow.capture.watcher.config import EmbeddedTargetConfig, WatchedTable, WatcherConfig
    from cdcflow.capture.watcher.source import Poller, WatcherSource

    db_path = str(tmp_path / "shop.db")
    database = Database.open(db_path)
    database.ddl([SINGERS, INDEX])
    source = WatcherSource(WatcherConfig(EmbeddedTargetConfig(db_path), (WatchedTable(
        "Singers", "LastModified", "ShardId", tuple(range(-18, 19))),), str(tmp_path / "l.db")))
    snapshot = source.snapshot(source.discover(), None)
    source.release(snapshot)
    log = open_log(source.log_location()[0])
    poller = Poller(source, log, log.position(source.source_id).position)
    for number, first in ((1, "a"), (1, "b"), (2, "x"), (1, "c")):
        with database.transaction() as tx:
            tx.insert_or_update("Singers", {"SingerId": number, "FirstName": first,
                                            "LastName": "l", "LastModified": COMMIT_TIMESTAMP})
    poller.round()
    records = follow_change_stream(log, "changes", snapshot.cdc_start,
                                   log.current_timestamp()).records
    seen = {int(m.keys["SingerId"]): (m.position.get("versions_seen"), m.new_values["FirstName"])
            for r in records for m in r.mods}
    assert seen == {1: (3, "c"), 2: (1, "x")}
    source.close()
    database.close()
