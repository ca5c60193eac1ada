"""The runner end to end: backfill from a snapshot plus CDC from its timestamp under
concurrent writes, into a CDC table and event files; drain; states and status in the catalog."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from pathlib import Path

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
