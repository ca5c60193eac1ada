"""A stream's first start (EV-9) when an earlier stream of its name left a checkpoint and
batches in its destinations: the checkpoint goes, and each destination numbers the new
stream's batches on from its own, so that none is taken for an earlier one's (EV-7) and the
event manifests stay without a gap."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdcflow import Database
from cdcflow.events.files import EventFileWriter
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.setup import FIRST_BATCHES, numbered, prepare_stream, start_afresh
from cdcflow.table import CdcTable

pytestmark = pytest.mark.unit


def lake(tmp_path: Path) -> StreamDefinition:
    db = Database.open(str(tmp_path / "shop.db"))
    db.ddl("CREATE TABLE Orders (Id INT64 NOT NULL) PRIMARY KEY (Id)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    db.close()
    return StreamDefinition.parse({
        "name": "lake", "source": {"database": str(tmp_path / "shop.db"), "change_stream": "S"},
        "destinations": [{"kind": "cdc_table", "warehouse": str(tmp_path / "warehouse")},
                         {"kind": "event_files", "root": str(tmp_path / "events")}]})


def test_numbers_go_on_from_each_destination_s_own_and_the_checkpoint_goes(tmp_path: Path):
    catalog = Catalog(tmp_path / "catalog.db")
    setup = prepare_stream(lake(tmp_path), tmp_path, catalog)
    connection = CdcTable.open(setup.tables["Orders"]).connection()
    for version in range(8):  # the earlier stream's table holds its batches 0..7
        connection.append([{"Id": version, "_CHANGE_TYPE": "UPSERT"}],
                          app_id=setup.plan.app_id, version=version)
    writer = EventFileWriter(tmp_path / "events", "lake")
    for batch in range(5):  # and its event manifests 0..4 (an events destination added late)
        writer.commit_batch(batch, [])
    writer.commit_batch("backfill-Orders-x-000000", [])  # not a streaming batch: not counted
    checkpoints = tmp_path / "checkpoints"
    (checkpoints / "lake" / "offsets").mkdir(parents=True)
    (checkpoints / "lake.control").write_text("stop")
    (checkpoints / "other").mkdir()
    first = start_afresh(setup, checkpoints)
    assert first == {"tables": 8, "events": 5}
    assert sorted(p.name for p in checkpoints.iterdir()) == ["other"]
    plan = numbered(setup.plan, {FIRST_BATCHES: first})
    assert (plan.first_table_batch, plan.first_event_batch) == (8, 5)
    assert numbered(setup.plan, {}) == setup.plan  # a stream from before: from 0


def test_a_first_stream_of_its_name_starts_at_zero(tmp_path: Path):
    setup = prepare_stream(lake(tmp_path), tmp_path, Catalog(tmp_path / "catalog.db"))
    assert start_afresh(setup, tmp_path / "checkpoints") == {"tables": 0, "events": 0}
    assert (setup.plan.first_table_batch, setup.plan.first_event_batch) == (0, 0)
