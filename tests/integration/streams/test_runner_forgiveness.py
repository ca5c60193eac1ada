"""A stream's failures stop counting once it shows it is well again (EV-9's retries): when it
writes changes after a retry, and when a drain finishes. Before, only `healthy_seconds`
without a change of state forgave them; `cdcflow verify` asks a running stream to drain
every fraction of a second, so a stream that failed now and then while verify waited came
to FAILED_PERMANENTLY with each failure mended (seen on CI's cluster test)."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import pytest

from cdcflow.streams.states import StreamState
from cdcflow.testing import run_mixed_writer
from tests.integration.streams.test_runner import running, wait_for, workload_stream

pytestmark = pytest.mark.integration


def wait_retries(catalog, name: str, retries: int, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while catalog.get(name).retries != retries:
        assert time.monotonic() < deadline, (catalog.get(name), catalog.errors(name))
        time.sleep(0.05)


def test_writing_after_a_retry_and_a_finished_drain_forgive_failures(spark, tmp_path: Path):
    db, catalog = workload_stream(tmp_path, "CREATE CHANGE STREAM Everything FOR ALL", {
        "name": "lake",
        "destinations": [{"kind": "event_files", "root": str(tmp_path / "events")}]})
    aside = Path(f"{db.path}.aside")
    os.rename(db.path, aside)  # the source is gone for a while: each start fails
    with running(tmp_path / "catalog.db", spark, max_retries=5, backoff_seconds=0.2,
                 healthy_seconds=3600):
        wait_retries(catalog, "lake", 2)
        os.rename(aside, db.path)  # back: the next retry runs
        wait_for(catalog, "lake", StreamState.RUNNING)
        assert catalog.get("lake").retries >= 2  # running is not yet being well
        run_mixed_writer(db.path, 3, 20)
        wait_retries(catalog, "lake", 0)  # it wrote them: forgiven
        assert catalog.status("lake")["rows_processed"] > 0
        assert "shop.db" in catalog.errors("lake")[-1]["message"]

        with sqlite3.connect(tmp_path / "catalog.db") as conn:  # as if it had failed twice
            conn.execute("UPDATE streams SET retries = 2 WHERE name = 'lake'")
        run_mixed_writer(db.path, 4, 20)
        catalog.act("lake", "drain")
        wait_for(catalog, "lake", StreamState.PAUSED)
        assert catalog.get("lake").retries == 0  # the drain finished: forgiven
