"""A stream's first start (EV-9) when an earlier stream of its name left a checkpoint, row
state and batches in its destinations: the checkpoint and the row state go, its CDC-table
commits carry an app id of their own, and its event batches are as_recorded on from the
manifests under its name, so that none of its batches is taken for an earlier one's and
skipped (EV-7). Only the first start does this: a restart, a resume or a retry keeps the
checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdcflow import Database, FakeClock
from cdcflow.events.files import EventFileWriter
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.runner import Runner, Worker
from cdcflow.streams.setup import APP_ID, as_recorded, prepare_stream, start_afresh
from cdcflow.streams.states import StreamState
from cdcflow.table import CdcTable
from cdcflow.table.pending import applied_version
from cdcflow.table.writers import TableWriter

pytestmark = pytest.mark.unit


def lake(tmp_path: Path, destinations: list[dict[str, Any]]) -> Catalog:
    """A catalog with stream `lake` over an embedded database with table `Orders`."""
    db = Database.open(str(tmp_path / "shop.db"))
    db.ddl("CREATE TABLE Orders (Id INT64 NOT NULL) PRIMARY KEY (Id)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    db.close()
    catalog = Catalog(tmp_path / "catalog.db")
    catalog.create(StreamDefinition.parse({
        "name": "lake", "source": {"database": str(tmp_path / "shop.db"), "change_stream": "S"},
        "destinations": destinations}))
    return catalog


def left_checkpoint(tmp_path: Path) -> Path:
    checkpoints = tmp_path / "checkpoints"
    (checkpoints / "lake" / "offsets").mkdir(parents=True)
    (checkpoints / "lake.control").write_text("stop")
    (checkpoints / "other").mkdir(exist_ok=True)
    return checkpoints


def test_a_first_start_sweeps_the_earlier_stream_s_leavings(tmp_path: Path):
    catalog = lake(tmp_path, [{"kind": "cdc_table", "warehouse": str(tmp_path / "warehouse")},
                              {"kind": "event_files", "root": str(tmp_path / "events")}])
    setup = prepare_stream(catalog.get("lake").definition, tmp_path, catalog)
    root = setup.tables["Orders"]
    connection = CdcTable.open(root).connection()
    for version in range(8):  # the earlier stream's table holds its batches 0..7
        connection.append([{"Id": version, "_CHANGE_TYPE": "UPSERT"}], app_id="stream:lake",
                          version=version)
    writer = EventFileWriter(tmp_path / "events", "lake")
    for batch in range(5):  # and its event manifests 0..4
        writer.commit_batch(batch, [])
    writer.commit_batch("backfill-Orders-x-000000", [])  # not a streaming batch: not counted
    checkpoints = left_checkpoint(tmp_path)
    start_afresh(setup.definition, tmp_path, catalog)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["other"]
    plan = as_recorded(setup.plan, catalog.status("lake"))
    assert plan.app_id.startswith("stream:lake#") and plan.first_event_batch == 5
    assert applied_version(root, plan.app_id) is None  # no batch of its taken as written
    assert len(CdcTable.open(root).to_arrow()) == 8  # a destination's rows stay


def test_only_the_first_start_sweeps(tmp_path: Path):
    """A restart, resume or retry (an app id recorded) and a stream from before these keys
    (its CDC start recorded) keep their checkpoint and numbering."""
    catalog = lake(tmp_path, [{"kind": "cdc_table", "warehouse": str(tmp_path / "warehouse")}])
    setup = prepare_stream(catalog.get("lake").definition, tmp_path, catalog)
    start_afresh(setup.definition, tmp_path, catalog)
    recorded = catalog.status("lake")[APP_ID]
    checkpoints = left_checkpoint(tmp_path)  # the stream's own, from its first run
    start_afresh(setup.definition, tmp_path, catalog)
    assert (checkpoints / "lake" / "offsets").is_dir() and catalog.status("lake")[APP_ID] == (
        recorded)
    catalog.delete("lake")
    catalog = lake(tmp_path / "before", [{"kind": "cdc_table",
                                           "warehouse": str(tmp_path / "warehouse2")}])
    catalog.update_status("lake", cdc_start=1)  # started by a cdcflow before app ids
    checkpoints = left_checkpoint(tmp_path / "before")
    start_afresh(setup.definition, tmp_path / "before", catalog)
    assert (checkpoints / "lake" / "offsets").is_dir()
    assert as_recorded(setup.plan, catalog.status("lake")).app_id == "stream:lake"


def test_row_state_goes_at_a_first_start_but_not_after_backfill_began(tmp_path: Path):
    """Without a CDC-table destination the stream keeps each object's rows in its own state
    tables, to give events whole rows (EV-5): an earlier stream's rows would be another
    source's, and go, for objects the source has now or not. Another catalog's `lake` on
    the same storage root keeps its own. A first start cut short after its backfill began
    (by a cdcflow before app ids) keeps what it backfilled."""
    catalog = lake(tmp_path, [{"kind": "event_files", "root": str(tmp_path / "events")}])
    setup = prepare_stream(catalog.get("lake").definition, tmp_path, catalog)
    CdcTable.open(setup.tables["Orders"]).connection().append(
        [{"Id": 1, "_CHANGE_TYPE": "UPSERT"}])
    state = tmp_path / "state" / "lake"
    TableWriter("stream:lake", "", "").claim(state / "Customers", "Customers")  # gone since
    TableWriter("stream:lake@catalog:other", "", "").claim(state / "Items", "Items")
    start_afresh(setup.definition, tmp_path, catalog)
    prepare_stream(setup.definition, tmp_path, catalog)  # as the runner does next
    assert len(CdcTable.open(setup.tables["Orders"]).to_arrow()) == 0  # made again, empty
    assert sorted(p.name for p in state.iterdir()) == ["Items", "Orders"]
    cut_short = lake(tmp_path / "cut", [{"kind": "event_files", "root": str(tmp_path / "ev")}])
    cut_short.update_status("lake", backfill={"Orders": {"state": "RUNNING", "rows": 1}})
    setup = prepare_stream(cut_short.get("lake").definition, tmp_path / "cut", cut_short)
    CdcTable.open(setup.tables["Orders"]).connection().append(
        [{"Id": 2, "_CHANGE_TYPE": "UPSERT"}])
    start_afresh(setup.definition, tmp_path / "cut", cut_short)
    assert len(CdcTable.open(setup.tables["Orders"]).to_arrow()) == 1


class LeftRunning:
    """Stands in for the Spark query of a stream paused (and deleted, and created again)
    within one turn of the runner: still active when the runner sees STARTING."""

    isActive = True

    def exception(self) -> None:
        return None

    def stop(self) -> None:
        self.isActive = False


def test_a_start_stops_the_query_a_pause_within_one_turn_left(tmp_path: Path):
    catalog = lake(tmp_path, [{"kind": "cdc_table", "warehouse": str(tmp_path / "warehouse")}])
    runner = Runner(catalog.path, spark=None, clock=FakeClock())
    left = LeftRunning()
    runner.workers["lake"] = Worker("lake", query=left)
    catalog.act("lake", "start")
    runner.step()
    worker = runner.workers["lake"]
    assert worker.thread is not None
    worker.thread.join(60)
    assert not left.isActive and worker.query is None
    assert catalog.get("lake").state == StreamState.RUNNING
