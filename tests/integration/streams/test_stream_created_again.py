"""A stream deleted and created again under its name (EV-9), from another source, into the
same warehouse and event root. It used to resume the earlier stream's Spark checkpoint,
whose offsets are the other source's, and fail; and with a checkpoint of its own, its
batches would have been numbered from 0 again, which its destinations hold for the
earlier stream: each of them taken as written and skipped, its changes lost (EV-7). It
starts afresh and numbers its batches on from theirs."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdcflow import Database
from cdcflow.events.files import EventFileWriter, read_json_events
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.states import StreamState
from cdcflow.table import CdcTable
from tests.integration.streams.test_runner import running, wait_for

pytestmark = pytest.mark.integration


def shop(path: Path, ids: range) -> Database:
    db = Database.open(str(path))
    db.ddl("CREATE TABLE Orders (Id INT64 NOT NULL, Note STRING(MAX)) PRIMARY KEY (Id)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    write(db, ids)
    return db


def write(db: Database, ids: range) -> None:
    for i in ids:
        with db.transaction() as tx:
            tx.insert_or_update("Orders", {"Id": i, "Note": f"n{i}"})


def run_once(catalog: Catalog, spark: object, source: Path, ids: range,
             action: str = "start") -> None:
    """`action` stream `lake`, run it, write `ids` into `source` while it runs, drain it."""
    catalog.act("lake", action)
    with running(Path(catalog.path), spark):
        wait_for(catalog, "lake", StreamState.RUNNING)
        db = Database.open(str(source))
        write(db, ids)
        db.close()
        catalog.act("lake", "drain")
        wait_for(catalog, "lake", StreamState.PAUSED)


def create(catalog: Catalog, source: Path, warehouse: Path, events: Path) -> None:
    catalog.create(StreamDefinition.parse({
        "name": "lake", "source": {"database": str(source), "change_stream": "S"},
        "destinations": [{"kind": "cdc_table", "warehouse": str(warehouse)},
                         {"kind": "event_files", "root": str(events)}],
        "spark": {"trigger_seconds": 0.3}}))


def test_a_stream_created_again_under_its_name_delivers_every_change(spark, tmp_path: Path):
    catalog = Catalog(tmp_path / "catalog.db")
    warehouse, events = tmp_path / "warehouse", tmp_path / "events"
    shop(tmp_path / "a.db", range(1, 4))
    create(catalog, tmp_path / "a.db", warehouse, events)
    run_once(catalog, spark, tmp_path / "a.db", range(4, 7))
    assert catalog.status("lake")["first_event_batch"] == 0
    written = catalog.status("lake")["batches"]
    catalog.delete("lake")
    shop(tmp_path / "b.db", range(100, 103))
    create(catalog, tmp_path / "b.db", warehouse, events)
    run_once(catalog, spark, tmp_path / "b.db", range(103, 106))
    status = catalog.status("lake")
    assert status["first_event_batch"] == written  # every batch commits a manifest
    run_once(catalog, spark, tmp_path / "b.db", range(106, 109), "resume")  # its checkpoint
    assert catalog.status("lake")["app_id"] == status["app_id"]
    assert catalog.errors("lake") == []
    rows = CdcTable.open(warehouse / "Orders").to_arrow().to_pylist()
    assert sorted(r["Id"] for r in rows) == [*range(1, 7), *range(100, 109)]
    delivered = [int(e["payload"]["Id"]) for f in EventFileWriter(events, "lake")
                 .committed_files() for e in read_json_events(f)]  # no batch missing
    assert sorted(delivered) == [*range(1, 7), *range(100, 109)]  # none delivered twice
