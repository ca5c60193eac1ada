"""A stream that fails is recorded, retried with backoff, then needs a human (EV-9)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.runner import Runner
from cdcflow.streams.states import StreamState

pytestmark = pytest.mark.unit


def test_failures_retry_with_backoff_then_fail_permanently(tmp_path: Path):
    catalog = Catalog(tmp_path / "catalog.db")
    catalog.create(StreamDefinition.parse({
        "name": "broken", "source": {"database": str(tmp_path / "missing.db"),
                                     "change_stream": "S"},
        "destinations": [{"kind": "event_files", "root": str(tmp_path / "events")}]}))
    catalog.act("broken", "start")
    runner = Runner(tmp_path / "catalog.db", spark=None, max_retries=2, backoff_seconds=0.05)
    seen = []
    deadline = time.monotonic() + 30
    while catalog.get("broken").state != StreamState.FAILED_PERMANENTLY:
        assert time.monotonic() < deadline, seen
        runner.step()
        for worker in runner.workers.values():
            if worker.thread is not None:
                worker.thread.join()
        seen.append(catalog.get("broken").state)
        time.sleep(0.02)
    assert StreamState.FAILED in seen and StreamState.STARTING in seen
    record = catalog.get("broken")
    assert record.retries == 2
    errors = catalog.errors("broken")
    assert len(errors) == 3 and "missing.db" in errors[0]["message"]
    runner.step()  # a human must act now: nothing changes
    assert catalog.get("broken").state == StreamState.FAILED_PERMANENTLY
    assert catalog.act("broken", "reset") == StreamState.NOT_STARTED
