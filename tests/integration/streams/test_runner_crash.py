"""Event files and CDC tables stay exactly once when the runner (driver and JVM) is SIGKILLed
mid-stream and started again: every change is in the events once, and the CDC table equals the
source."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cdcflow import Database
from cdcflow.events.files import EventFileWriter, read_json_events
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.table import CdcTable
from cdcflow.testing import WORKLOAD_DDL, run_writer

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "cdcflow.cli.main", "run", "--master", "local[2]", "--json",
       "--lease-seconds", "3"]  # the restart takes the killed runner's lease soon


def test_killed_runner_restarts_without_duplicates_or_gaps(tmp_path: Path):
    path = str(tmp_path / "shop.db")
    db = Database.open(path)
    db.ddl(WORKLOAD_DDL)
    db.ddl("CREATE CHANGE STREAM Everything FOR ALL")
    catalog_path = str(tmp_path / "catalog.db")
    catalog = Catalog(catalog_path)
    catalog.create(StreamDefinition.parse({
        "name": "s", "source": {"database": path, "change_stream": "Everything"},
        "include": ["Accounts"],
        "destinations": [{"kind": "cdc_table", "warehouse": str(tmp_path / "w")},
                         {"kind": "event_files", "root": str(tmp_path / "events")}],
        "spark": {"trigger_seconds": 0.3, "max_records_per_trigger": 40}}))
    catalog.act("s", "start")
    writer = multiprocessing.get_context("spawn").Process(
        target=run_writer, args=(path, 3, 600, str(tmp_path / "history.jsonl"), 200, 0.02))
    runner = subprocess.Popen([*CLI, "--catalog", catalog_path], start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while catalog.get("s").state.value != "RUNNING":
        assert runner.poll() is None and time.monotonic() < deadline, catalog.errors("s")
        time.sleep(0.1)
    writer.start()
    while (catalog.status("s").get("batches") or 0) < 4:
        assert runner.poll() is None and time.monotonic() < deadline, catalog.errors("s")
        time.sleep(0.1)
    os.killpg(runner.pid, signal.SIGKILL)  # mid-stream, most likely mid-batch
    runner.wait()
    writer.join(timeout=300)
    assert writer.exitcode == 0
    catalog.act("s", "drain")
    again = subprocess.Popen([*CLI, "--catalog", catalog_path], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while catalog.get("s").state.value != "PAUSED":
            assert again.poll() is None and time.monotonic() < deadline, catalog.errors("s")
            time.sleep(0.3)
    finally:
        os.killpg(again.pid, signal.SIGINT)
        again.wait(timeout=120)
    source = {r["Id"]: r for r in db.scan("Accounts")}
    table = CdcTable.open(tmp_path / "w" / "Accounts")
    assert {r["Id"]: r for r in table.to_arrow().to_pylist()} == source
    files = EventFileWriter(tmp_path / "events", "s").committed_files()
    events = [e for f in files for e in read_json_events(f)]
    assert len(events) == len({e["uuid"] for e in events}), "an event was written twice"
    cdc = sorted((e for e in events if e["read_method"] == "embedded-cdc-changestream"),
                 key=lambda e: [int(e["sort_keys"][0]), e["sort_keys"][1],
                                e["sort_keys"][2], int(e["sort_keys"][3])])
    state = {int(e["payload"]["Id"]): e["payload"] for e in events
             if e["read_method"] == "embedded-backfill-snapshot"}
    for event in cdc:
        key = int(event["payload"]["Id"])
        if event["source_metadata"]["is_deleted"]:
            state.pop(key, None)
        else:
            state[key] = event["payload"]
    assert {k: (v["Owner"], None if v["Balance"] is None else int(v["Balance"]))
            for k, v in state.items()} == {k: (r["Owner"], r["Balance"])
                                           for k, r in source.items()}
