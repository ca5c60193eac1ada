"""Each creation of a stream has an id of its own (`Catalog.scoped`): a runner's work for a
stream deleted meanwhile, and perhaps created again under its name, writes nothing into the
new stream's status, errors or state (EV-9). Before, a start still backfilling a stream that
was paused, deleted and created again wrote its snapshot and CDC start into the new one's
status, so that the new stream skipped its own first start and backfill."""

from __future__ import annotations

import sqlite3
import threading
import time
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
                        lambda name, target, args, scope: started.append((*args, scope)))
    setup = SimpleNamespace(definition=record.definition, source=SimpleNamespace(has_worker=True))
    runner._ensure_capture(setup, record.creation)  # type: ignore[arg-type]
    assert started == [(record.definition.model_dump_json(), catalog.path, record.creation,
                        True, record.creation)]


def test_the_applier_s_reports_for_an_earlier_creation_write_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An apply in flight when its stream is deleted and created again: neither its tables'
    status nor its failure reaches the new stream."""
    catalog = lake(tmp_path, [{"kind": "cdc_table", "warehouse": str(tmp_path / "warehouse")}])
    record = catalog.get("lake")
    setup = prepare_stream(record.definition, tmp_path, catalog)
    runner = Runner(catalog.path, spark=None)
    runner.applier.watch("lake", setup.tables, 5.0, record.creation)
    runner.applier.apply_due("lake", force=True)
    assert set(catalog.status("lake")["tables"]) == {"Orders"}
    _create_again(catalog)
    runner.applier.apply_due("lake", force=True)
    assert "tables" not in catalog.status("lake")

    def failing(*_: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(runner.applier, "_apply", failing)
    runner.applier.apply_due("lake", force=True)
    assert catalog.errors("lake") == []
    runner.applier.forget("lake")
    runner.applier.watch("lake", setup.tables, 5.0, catalog.get("lake").creation)
    runner.applier.apply_due("lake", force=True)  # the new creation's own: written
    assert [e["message"] for e in catalog.errors("lake")] == ["apply failed: OSError: disk full"]


def test_a_drain_of_an_earlier_creation_fails_nothing_of_the_new_stream(tmp_path: Path):
    catalog = lake(tmp_path, _events(tmp_path))
    record = catalog.get("lake")
    runner = Runner(catalog.path, spark=None)
    worker = runner.workers["lake"] = Worker("lake", record.creation)
    worker.query = SimpleNamespace(exception=lambda: RuntimeError("the query failed"))
    _create_again(catalog)
    runner._drain(record)
    assert catalog.errors("lake") == []
    assert catalog.get("lake").state == StreamState.NOT_STARTED


def test_a_query_that_will_not_stop_reports_only_to_its_own_creation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    catalog = lake(tmp_path, _events(tmp_path))
    runner = Runner(catalog.path, spark=None)

    def refuse(*_: Any, **__: Any) -> None:
        raise RuntimeError("would not come to rest")

    monkeypatch.setattr(runner_module, "stop_between_batches", refuse)
    said = []
    for creation_changed in (False, True):
        worker = Worker("lake", catalog.get("lake").creation)
        if creation_changed:
            _create_again(catalog)
        worker.query = SimpleNamespace(isActive=True, stop=lambda: None)
        runner._stop_query(worker)
        said.append([e["message"] for e in catalog.errors("lake")])
    assert said == [["RuntimeError: would not come to rest"], []]


def _exit_at_once() -> None:
    """A capture worker that dies as soon as it starts."""


def _death_of(runner: Runner, creation: str | None) -> None:
    """Start a capture worker for `creation` that dies, and let the runner notice it."""
    runner.capture.ensure("lake", _exit_at_once, (), creation)
    deadline = time.monotonic() + 60
    while runner.capture.info("lake")["alive"]:  # type: ignore[index]
        assert time.monotonic() < deadline, "the worker did not end"
        time.sleep(0.05)
    runner.capture.ensure("lake", _exit_at_once, (), creation)  # buries it, starts another


def test_a_capture_worker_s_death_is_reported_only_to_its_own_creation(tmp_path: Path):
    catalog = lake(tmp_path, _events(tmp_path))
    earlier = catalog.get("lake").creation
    runner = Runner(catalog.path, spark=None)
    runner.capture.backoff = 0.0
    _death_of(runner, earlier)
    assert [e["message"][:32] for e in catalog.errors("lake")] == [
        "capture worker exited with code "]
    _create_again(catalog)
    _death_of(runner, earlier)  # a worker the new creation's runner had not stopped yet
    assert catalog.errors("lake") == []
    runner.capture.stop_all()


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
