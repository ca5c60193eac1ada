"""A stream that fails is recorded, retried with exponential backoff, and after `max_retries`
consecutive failures (or at once, for an error no retry mends) needs a human (EV-9)."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest

from cdcflow import Database, FakeClock
from cdcflow.errors import FailedPrecondition, InvalidArgument, NotFound, TypeMismatch
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.failures import is_permanent
from cdcflow.streams.runner import Runner
from cdcflow.streams.states import StreamState

pytestmark = pytest.mark.unit


def stream(tmp_path: Path, database: Path, name: str = "s") -> Catalog:
    catalog = Catalog(tmp_path / "catalog.db")
    catalog.create(StreamDefinition.parse({
        "name": name, "source": {"database": str(database), "change_stream": "S"},
        "destinations": [{"kind": "event_files", "root": str(tmp_path / "events")}]}))
    catalog.act(name, "start")
    return catalog


def drive(runner: Runner, catalog: Catalog, clock: FakeClock, name: str = "s",
          steps: int = 400) -> list[tuple[float, StreamState]]:
    """Step the runner, moving the fake clock 0.1 s a step; the states seen, with times."""
    seen: list[tuple[float, StreamState]] = []
    for _ in range(steps):
        runner.step()
        for worker in runner.workers.values():
            if worker.thread is not None:
                worker.thread.join()
        state = catalog.get(name).state
        if not seen or seen[-1][1] != state:
            seen.append((clock.now().timestamp(), state))
        if state == StreamState.FAILED_PERMANENTLY:
            break
        clock.advance(timedelta(seconds=0.1))
    return seen


def test_failures_retry_with_exponential_backoff_then_fail_permanently(tmp_path: Path):
    clock = FakeClock()
    catalog = stream(tmp_path, tmp_path / "missing.db")
    runner = Runner(tmp_path / "catalog.db", spark=None, max_retries=3, backoff_seconds=1.0,
                    clock=clock)
    seen = drive(runner, catalog, clock)
    assert seen[-1][1] == StreamState.FAILED_PERMANENTLY
    failed = [t for t, s in seen if s == StreamState.FAILED]
    retried = [t for t, s in seen if s == StreamState.STARTING]
    gaps = [round(r - f, 1) for f, r in zip(failed, retried, strict=False)]
    assert gaps == [1.0, 2.0, 4.0]  # backoff doubles with each consecutive failure
    assert catalog.get("s").retries == 3
    errors = catalog.errors("s")
    assert len(errors) == 4 and "missing.db" in errors[0]["message"]
    runner.step()  # a human must act now: nothing changes
    assert catalog.get("s").state == StreamState.FAILED_PERMANENTLY
    assert catalog.act("s", "reset") == StreamState.NOT_STARTED
    assert catalog.get("s").retries == 0


def test_by_default_five_retries_are_about_half_a_minute_of_trying(tmp_path: Path):
    """A cluster's passing trouble (an executor lost as the runner restarts, say) can last
    longer than the 7 s that three retries gave; README says five, 1 + 2 + 4 + 8 + 16 s."""
    clock = FakeClock()
    catalog = stream(tmp_path, tmp_path / "missing.db")
    runner = Runner(tmp_path / "catalog.db", spark=None, clock=clock)
    seen = drive(runner, catalog, clock, steps=600)
    assert seen[-1][1] == StreamState.FAILED_PERMANENTLY
    failed = [t for t, s in seen if s == StreamState.FAILED]
    retried = [t for t, s in seen if s == StreamState.STARTING]
    assert [round(r - f, 1) for f, r in zip(failed, retried, strict=False)] == [
        1.0, 2.0, 4.0, 8.0, 16.0]
    assert catalog.get("s").retries == 5 and len(catalog.errors("s")) == 6


def test_a_stream_failing_after_it_runs_does_not_retry_forever(tmp_path: Path):
    """Each retry reaches RUNNING and then fails (here: no Spark to start a query with).
    `started` must not forgive the failures, or the stream would loop for ever."""
    clock = FakeClock()
    path = tmp_path / "shop.db"
    db = Database.open(path)
    db.ddl("CREATE TABLE T (Id INT64 NOT NULL) PRIMARY KEY (Id)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    catalog = stream(tmp_path, path)
    runner = Runner(tmp_path / "catalog.db", spark=None, max_retries=2, backoff_seconds=0.5,
                    clock=clock)
    seen = drive(runner, catalog, clock)
    states = [s for _, s in seen]
    assert states.count(StreamState.RUNNING) == 3  # the first run and two retries
    assert states[-1] == StreamState.FAILED_PERMANENTLY
    assert len(catalog.errors("s")) == 3


def test_an_error_no_retry_mends_is_permanent_at_once(tmp_path: Path):
    clock = FakeClock()
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE x (y)")
    catalog = stream(tmp_path, foreign)
    runner = Runner(tmp_path / "catalog.db", spark=None, max_retries=5, clock=clock)
    seen = drive(runner, catalog, clock, steps=20)
    assert [s for _, s in seen] == [StreamState.FAILED_PERMANENTLY]
    (error,) = catalog.errors("s")
    assert "FailedPrecondition" in error["message"] and "not a cdcflow database" in \
        error["message"]


@pytest.mark.parametrize(("error", "permanent"), [
    (InvalidArgument("x"), True), (TypeMismatch("x"), True), (FailedPrecondition("x"), True),
    (NotFound("x"), False), (RuntimeError("disk full"), False),
    (RuntimeError("...\ncdcflow.errors.TypeMismatch: value 'a' does not fit"), True),
    (RuntimeError("... cdcflow.errors.NotFound: table gone"), False),
])
def test_permanent_errors_are_told_apart_also_from_spark_text(error: BaseException,
                                                              permanent: bool):
    assert is_permanent(error) is permanent


def test_a_start_that_ends_after_the_loop_read_the_state_is_not_run_twice(tmp_path: Path):
    """The loop reads every stream's state, then supervises each. When a start thread ends
    (STARTING -> RUNNING) between the two, the stale STARTING must not start the stream
    again: the second start found RUNNING and failed the stream for good (a CI run of the
    cluster test lost its PostgreSQL stream so)."""
    catalog = stream(tmp_path, tmp_path / "unused.db")
    runner = Runner(tmp_path / "catalog.db", spark=None, clock=FakeClock())
    starts: list[str] = []
    kept: list[str] = []

    def start(record):
        starts.append(record.definition.name)
        catalog.act(record.definition.name, "started")

    runner._start = start  # type: ignore[method-assign]
    runner._keep_running = lambda record, worker: kept.append(record.state.value)  # type: ignore[method-assign]
    stale = catalog.get("s")
    runner._supervise(stale)
    runner.workers["s"].thread.join()
    runner._supervise(stale)  # read before the start ended
    assert starts == ["s"] and kept == ["RUNNING"]
    assert catalog.get("s").state == StreamState.RUNNING
