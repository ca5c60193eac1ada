"""Each creation of a stream has an id of its own (`Catalog.scoped`): a runner's work for a
stream deleted meanwhile, and perhaps created again under its name, writes nothing into the
new stream's status, errors or state (EV-9). Before, a start still backfilling a stream that
was paused, deleted and created again wrote its snapshot and CDC start into the new one's
status, so that the new stream skipped its own first start and backfill."""

from __future__ import annotations

import sqlite3
import threading
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cdcflow import FakeClock
from cdcflow.errors import InvalidArgument
from cdcflow.streams import runner as runner_module
from cdcflow.streams.backfill import BackfillSink
from cdcflow.streams.catalog import Catalog, StreamGone
from cdcflow.streams.runner import Runner, Worker
from cdcflow.streams.setup import prepare_stream
from cdcflow.streams.states import StreamState
from tests.unit.streams.test_start_afresh import lake

pytestmark = pytest.mark.unit


def _events(tmp_path: Path) -> list[dict[str, Any]]:
    return [{"kind": "event_files", "root": str(tmp_path / "events")}]


def _create_again(catalog: Catalog) -> None:
    definition = catalog.get("lake").definition
    catalog.delete("lake")
    catalog.create(definition)


def test_a_scoped_catalog_writes_nothing_once_its_stream_is_created_again(tmp_path: Path):
    catalog = lake(tmp_path, _events(tmp_path))
    first = catalog.get("lake")
    assert first.creation is not None
    scoped = catalog.scoped("lake", first.creation)
    scoped.update_status("lake", snapshot={"at": 1})
    assert catalog.status("lake")["snapshot"] == {"at": 1}
    assert "created" not in catalog.status("lake")  # the id is not part of the status
    _create_again(catalog)
    second = catalog.get("lake")
    assert second.creation not in (None, first.creation)
    with pytest.raises(StreamGone, match="'lake' was deleted"):
        scoped.update_status("lake", cdc_start=1)
    with pytest.raises(StreamGone):
        scoped.record_error("lake", "*", "late")
    with pytest.raises(StreamGone):
        scoped.act("lake", "start")
    with pytest.raises(StreamGone):
        scoped.status("lake")
    status = catalog.status("lake")
    assert "cdc_start" not in status and "snapshot" not in status
    assert catalog.errors("lake") == [] and catalog.get("lake").state == StreamState.NOT_STARTED
    catalog.scoped("lake", second.creation).update_status("lake", cdc_start=2)
    assert catalog.status("lake")["cdc_start"] == 2
    catalog.delete("lake")
    with pytest.raises(StreamGone):  # deleted and not created again
        catalog.scoped("lake", second.creation).update_status("lake", cdc_start=3)


def test_a_stream_created_before_creation_ids_is_scoped_by_having_none(tmp_path: Path):
    catalog = lake(tmp_path, _events(tmp_path))
    conn = sqlite3.connect(catalog.path)
    with conn:
        conn.execute("DELETE FROM status WHERE key = 'created'")
    conn.close()
    assert catalog.get("lake").creation is None
    scoped = catalog.scoped("lake", None)
    scoped.update_status("lake", snapshot={"at": 1})
    _create_again(catalog)
    with pytest.raises(StreamGone):
        scoped.update_status("lake", cdc_start=1)


def test_the_creation_id_is_not_written_through_the_status(tmp_path: Path):
    catalog = lake(tmp_path, _events(tmp_path))
    creation = catalog.get("lake").creation
    with pytest.raises(InvalidArgument, match="'created'"):
        catalog.update_status("lake", created="mine")
    assert catalog.get("lake").creation == creation


def test_a_start_still_running_for_a_stream_created_again_writes_nothing_into_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The start's backfill is held while the stream is paused, deleted and created again;
    let go, it stops at its first look at the catalog, and the new stream is untouched."""
    catalog = lake(tmp_path, _events(tmp_path))
    catalog.act("lake", "start")
    record = catalog.get("lake")
    entered, let_go = threading.Event(), threading.Event()
    real = runner_module.run_backfill

    def held(*args: Any) -> None:
        entered.set()
        assert let_go.wait(60)
        real(*args)

    monkeypatch.setattr(runner_module, "run_backfill", held)
    runner = Runner(catalog.path, spark=None)
    runner.workers["lake"] = Worker("lake")
    start = threading.Thread(target=runner._start, args=(record,))
    start.start()
    assert entered.wait(60)
    catalog.act("lake", "pause")
    _create_again(catalog)
    let_go.set()
    start.join(60)
    assert not start.is_alive()
    status = catalog.status("lake")
    assert not {"snapshot", "snapshot_time", "cdc_start", "app_id", "waiting_for"} & set(status)
    assert catalog.get("lake").state == StreamState.NOT_STARTED
    assert catalog.errors("lake") == []


def test_a_stream_created_again_starts_without_what_late_writers_left(tmp_path: Path):
    """Status and errors written for the name after the deletion (by work that was not
    scoped: a last progress report, say) are not the new stream's."""
    catalog = lake(tmp_path, _events(tmp_path))
    definition = catalog.get("lake").definition
    catalog.delete("lake")
    catalog.update_status("lake", batches=7, rows_processed=99)
    catalog.record_error("lake", "*", "the earlier stream's")
    catalog.create(definition)
    status = catalog.status("lake")
    assert "batches" not in status and "rows_processed" not in status
    assert catalog.errors("lake") == []


def test_the_runner_keeps_nothing_of_an_earlier_creation(tmp_path: Path):
    catalog = lake(tmp_path, _events(tmp_path))
    earlier = catalog.get("lake").creation
    runner = Runner(catalog.path, spark=None)
    runner.workers["lake"] = Worker("lake", earlier, stats={"batches": 7})
    _create_again(catalog)
    runner.step()
    worker = runner.workers["lake"]
    assert worker.creation == catalog.get("lake").creation != earlier
    assert worker.stats == {}


def test_a_progress_report_of_an_earlier_creation_s_query_writes_nothing(tmp_path: Path):
    """A query that a pause, deletion and creation within one turn left running reports
    through the creation it was started for."""
    catalog = lake(tmp_path, _events(tmp_path))
    runner = Runner(catalog.path, spark=None)
    worker = Worker("lake", catalog.get("lake").creation)
    result = {"rows": 3, "seconds": 0.1, "last_micros": None}
    report = (str(tmp_path / "shop.db"), "S", result, worker)
    runner._record_progress("lake", *report)
    assert catalog.status("lake")["batches"] == 1
    _create_again(catalog)
    runner._record_progress("lake", *report)
    assert "batches" not in catalog.status("lake")


def test_a_capture_worker_starts_scoped_to_the_creation_the_runner_drives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    catalog = lake(tmp_path, _events(tmp_path))
    record = catalog.get("lake")
    runner = Runner(catalog.path, spark=None)
    runner.workers["lake"] = Worker("lake", record.creation)
    started: list[tuple[Any, ...]] = []
    monkeypatch.setattr(runner.capture, "ensure",
                        lambda name, target, args: started.append(args))
    setup = SimpleNamespace(definition=record.definition, source=SimpleNamespace(has_worker=True))
    runner._ensure_capture(setup, record.creation)  # type: ignore[arg-type]
    assert started == [(record.definition.model_dump_json(), catalog.path, record.creation,
                        True)]


def test_a_backfill_chunk_of_a_stream_deleted_meanwhile_is_not_written(tmp_path: Path):
    catalog = lake(tmp_path, _events(tmp_path))
    record = catalog.get("lake")
    setup = prepare_stream(record.definition, tmp_path, catalog)
    scoped = catalog.scoped("lake", record.creation)
    sink = BackfillSink(setup, scoped, datetime(2026, 1, 1, tzinfo=UTC), {}, FakeClock())
    (item,) = setup.objects.values()
    sink(item, [{"Id": 1}], None)
    written = sorted(p.name for p in (tmp_path / "events").rglob("*") if p.is_file())
    assert written and catalog.status("lake")["backfill"]["Orders"]["chunks"] == 1
    _create_again(catalog)
    with pytest.raises(StreamGone):
        sink(item, [{"Id": 2}], None)
    assert sorted(p.name for p in (tmp_path / "events").rglob("*") if p.is_file()) == written
