"""The runner end to end: backfill from a snapshot plus CDC from its timestamp under
concurrent writes, into a CDC table and event files; drain; states and status in the catalog."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from cdcflow import Database, PartitionPolicy
from cdcflow.events.files import EventFileWriter, read_json_events
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.runner import Runner
from cdcflow.streams.states import StreamState
from cdcflow.table import CdcTable
from cdcflow.testing import WORKLOAD_DDL, run_mixed_writer

pytestmark = pytest.mark.integration


def wait_for(catalog: Catalog, name: str, state: StreamState, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while catalog.get(name).state != state:
        current = catalog.get(name).state
        assert current not in (StreamState.FAILED_PERMANENTLY,), catalog.errors(name)
        assert time.monotonic() < deadline, f"still {current}, errors {catalog.errors(name)}"
        time.sleep(0.2)


def test_backfill_then_cdc_under_concurrent_writes(spark, tmp_path: Path):
    path = str(tmp_path / "shop.db")
    db = Database.open(path, partition_policy=PartitionPolicy(split_records=150))
    db.ddl(WORKLOAD_DDL)
    db.ddl("CREATE CHANGE STREAM Everything FOR ALL")
    run_mixed_writer(path, 7, 200)  # rows that only the backfill can deliver
    definition = StreamDefinition.parse({
        "name": "lake", "source": {"database": path, "change_stream": "Everything"},
        "include": ["Accounts"], "backfill": "all",
        "destinations": [{"kind": "cdc_table", "warehouse": str(tmp_path / "warehouse")},
                         {"kind": "event_files", "root": str(tmp_path / "events")}],
        "spark": {"trigger_seconds": 0.5},
    })
    catalog = Catalog(tmp_path / "project" / "catalog.db")
    catalog.create(definition)
    catalog.act("lake", "start")
    runner = Runner(tmp_path / "project" / "catalog.db", spark, poll_seconds=0.2)
    stop = threading.Event()
    thread = threading.Thread(target=runner.run, args=(stop,))
    thread.start()
    writers = [multiprocessing.get_context("spawn").Process(target=run_mixed_writer,
                                                            args=(path, s, 300)) for s in (1, 2)]
    try:
        for writer in writers:
            writer.start()
        wait_for(catalog, "lake", StreamState.RUNNING)
        for writer in writers:
            writer.join(timeout=300)
            assert writer.exitcode == 0
        catalog.act("lake", "drain")
        wait_for(catalog, "lake", StreamState.PAUSED)
    finally:
        stop.set()
        thread.join(timeout=120)
    source = {r["Id"]: r for r in db.scan("Accounts")}
    table = CdcTable.open(tmp_path / "warehouse" / "Accounts")
    assert {r["Id"]: r for r in table.to_arrow().to_pylist()} == source
    status = catalog.status("lake")
    assert status["backfill"]["Accounts"]["state"] == "COMPLETED"
    assert status["backfill"]["Accounts"]["rows"] > 0
    assert status["rows_processed"] > 0 and status["partitions"] >= 1
    files = EventFileWriter(tmp_path / "events", "lake").committed_files()
    events = [e for f in files for e in read_json_events(f)]
    assert len({e["uuid"] for e in events}) == len(events)
    backfill = [e for e in events if e["read_method"] == "embedded-backfill-snapshot"]
    cdc = sorted((e for e in events if e["read_method"] == "embedded-cdc-changestream"),
                 key=lambda e: [int(e["sort_keys"][0]), e["sort_keys"][1],
                                e["sort_keys"][2], int(e["sort_keys"][3])])
    state = {int(e["payload"]["Id"]): e["payload"] for e in backfill}
    for event in cdc:
        key = int(event["payload"]["Id"])
        if event["source_metadata"]["is_deleted"]:
            state.pop(key)
        else:
            state[key] = event["payload"]
    decoded = {k: {"Id": int(v["Id"]), "Owner": v["Owner"],
                   "Balance": None if v["Balance"] is None else int(v["Balance"])}
               for k, v in state.items()}
    assert decoded == source
    assert json.loads(json.dumps(catalog.errors("lake"))) == []


@contextlib.contextmanager
def running(catalog: Path, spark: object, **options: float) -> Iterator[Runner]:
    """A runner supervising `catalog` in a thread, stopped on exit."""
    runner = Runner(catalog, spark, poll_seconds=0.2, **options)  # type: ignore[arg-type]
    stop = threading.Event()
    thread = threading.Thread(target=runner.run, args=(stop,))
    thread.start()
    try:
        yield runner
    finally:
        stop.set()
        thread.join(timeout=120)


def workload_stream(tmp_path: Path, stream_ddl: str, definition: dict) -> tuple[
        Database, Catalog]:
    """The workload tables with a change stream, and a started stream over them."""
    path = str(tmp_path / "shop.db")
    db = Database.open(path)
    db.ddl(WORKLOAD_DDL)
    db.ddl(stream_ddl)
    catalog = Catalog(tmp_path / "catalog.db")
    name = definition["name"]
    change_stream = stream_ddl.split()[3]
    catalog.create(StreamDefinition.parse(
        {"source": {"database": path, "change_stream": change_stream}, "include": ["Accounts"],
         "spark": {"trigger_seconds": 0.3}} | definition))
    catalog.act(name, "start")
    return db, catalog


def tombstones(root: Path) -> int:
    from deltalake import DeltaTable

    from cdcflow.table.layout import read_manifest

    manifest = read_manifest(DeltaTable(str(root)))
    states = [pq.read_table(root / f.state) for f in manifest.files]
    return sum(s.num_rows - s.column("_deleted_at").null_count for s in states)


def test_the_runner_applies_cdc_tables_and_forgives_a_healthy_stream(spark, tmp_path: Path):
    """AP-5 under `cdcflow run`: tables are applied at least every max_staleness / 2, so the
    watermark moves, pending rows stay bounded and tombstones expire; failures are forgiven
    once the stream has run well for `healthy_seconds`."""
    db, catalog = workload_stream(tmp_path, "CREATE CHANGE STREAM Everything FOR ALL", {
        "name": "lake",
        "destinations": [{"kind": "cdc_table", "warehouse": str(tmp_path / "warehouse"),
                          "max_staleness_seconds": 1.0, "delete_retention_seconds": 0}]})
    root = tmp_path / "warehouse" / "Accounts"
    with running(tmp_path / "catalog.db", spark, healthy_seconds=1.0):
        wait_for(catalog, "lake", StreamState.RUNNING)
        with sqlite3.connect(tmp_path / "catalog.db") as conn:  # as if it had failed twice
            conn.execute("UPDATE streams SET retries = 2 WHERE name = 'lake'")
        writer = multiprocessing.get_context("spawn").Process(target=run_mixed_writer,
                                                              args=(db.path, 5, 400))
        writer.start()
        watermarks = set()
        deadline = time.monotonic() + 180
        while writer.is_alive() or len(watermarks) < 3:
            assert time.monotonic() < deadline, catalog.status("lake")
            table = (catalog.status("lake").get("tables") or {}).get("Accounts")
            if table and table["apply_watermark"]:
                watermarks.add(table["apply_watermark"])
            time.sleep(0.2)
        assert writer.exitcode == 0
        while catalog.get("lake").retries != 0:  # forgiven after a healthy second
            assert time.monotonic() < deadline, catalog.get("lake")
            time.sleep(0.1)
        for _ in range(2):  # a batch, then one more after Spark has reported a trigger
            batches = catalog.status("lake").get("batches", 0)
            run_mixed_writer(db.path, 6, 20)
            while catalog.status("lake").get("batches", 0) == batches:
                assert time.monotonic() < deadline, catalog.status("lake")
                time.sleep(0.1)
        catalog.act("lake", "drain")
        wait_for(catalog, "lake", StreamState.PAUSED)
    status = catalog.status("lake")
    assert status["tables"]["Accounts"]["pending_rows"] == 0
    assert status["batches"] > 1 and status["batch_timing"]["write_ms"] > 0  # issue 11
    assert status["batch_timing"]["spark_ms"]["triggerExecution"] > 0  # Spark's own phases
    assert len(watermarks) >= 3  # applied again and again while it ran
    from deltalake import DeltaTable

    applied = {r["Id"]: r for r in DeltaTable(str(root)).to_pyarrow_table().to_pylist()}
    assert applied == {r["Id"]: r for r in db.scan("Accounts")}  # the baseline, not a merge
    deleted = set(range(150)) - set(applied)
    assert tombstones(root) < len(deleted)  # older tombstones expired (retention 0)
    assert catalog.errors("lake") == []


def test_events_hold_the_whole_row_without_a_cdc_table(spark, tmp_path: Path):
    """EV-5 with only an event-file destination and a change stream that captures partial
    rows (NEW_VALUES: an update holds the written columns, a delete only the key)."""
    db, catalog = workload_stream(
        tmp_path, "CREATE CHANGE STREAM Partial FOR ALL OPTIONS (value_capture_type = "
        "'NEW_VALUES')",
        {"name": "ev", "destinations": [{"kind": "event_files",
                                         "root": str(tmp_path / "events")}]})
    run_mixed_writer(db.path, 3, 100)  # before the backfill
    with running(tmp_path / "catalog.db", spark):
        wait_for(catalog, "ev", StreamState.RUNNING)
        run_mixed_writer(db.path, 4, 300)
        catalog.act("ev", "drain")
        wait_for(catalog, "ev", StreamState.PAUSED)
    files = EventFileWriter(tmp_path / "events", "ev").committed_files()
    events = [e for f in files for e in read_json_events(f)]
    backfill = [e for e in events if e["read_method"] == "embedded-backfill-snapshot"]
    cdc = sorted((e for e in events if e["read_method"] == "embedded-cdc-changestream"),
                 key=lambda e: [int(e["sort_keys"][0]), e["sort_keys"][1],
                                e["sort_keys"][2], int(e["sort_keys"][3])])
    state = {e["payload"]["Id"]: e["payload"] for e in backfill}
    for event in cdc:  # each payload replaces the row whole: partial payloads would lose data
        if event["source_metadata"]["is_deleted"]:
            assert state.pop(event["payload"]["Id"]) == event["payload"]  # the deleted row
        else:
            state[event["payload"]["Id"]] = event["payload"]
    source = {str(r["Id"]): {"Id": str(r["Id"]), "Owner": r["Owner"],
                             "Balance": None if r["Balance"] is None else str(r["Balance"])}
              for r in db.scan("Accounts")}
    assert state == source
    assert any(e["source_metadata"]["is_deleted"] for e in cdc)
    assert (tmp_path / "state" / "ev" / "Accounts").is_dir()  # the stream's own row state
    assert catalog.errors("ev") == []


def test_a_query_that_dies_is_recorded_and_retried(spark, tmp_path: Path):
    db, catalog = workload_stream(tmp_path, "CREATE CHANGE STREAM Everything FOR ALL", {
        "name": "q", "destinations": [{"kind": "cdc_table",
                                        "warehouse": str(tmp_path / "warehouse")}]})
    options = tmp_path / "warehouse" / "Accounts" / "_cdcflow" / "table.json"
    with running(tmp_path / "catalog.db", spark, backoff_seconds=0.5):
        wait_for(catalog, "q", StreamState.RUNNING)
        saved = options.read_text()
        options.write_text("{broken")  # every batch now fails in the executors
        run_mixed_writer(db.path, 9, 20)
        deadline = time.monotonic() + 120
        while not any("Spark query" in e["message"] for e in catalog.errors("q")):
            assert time.monotonic() < deadline, catalog.errors("q")
            time.sleep(0.2)
        options.write_text(saved)  # mended: the retry runs again
        wait_for(catalog, "q", StreamState.RUNNING)
        catalog.act("q", "drain")
        wait_for(catalog, "q", StreamState.PAUSED)
    table = CdcTable.open(tmp_path / "warehouse" / "Accounts")
    assert {r["Id"]: r for r in table.to_arrow().to_pylist()} == {
        r["Id"]: r for r in db.scan("Accounts")}
