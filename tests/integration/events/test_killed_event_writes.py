"""Attempts at an event batch SIGKILLed at random points of their writes, then the batch
written again and committed by an attempt cut otherwise (a restarted query on a cluster of
another size): the folders then hold exactly the files the manifests list, and every event
reads back once (EV-2). Before, the aside files of killed writes stayed for good, and the
killed attempt's files stayed beside the committed ones."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from cdcflow import Database
from cdcflow.events.files import EventFileWriter, Rotation
from tests.unit.events.test_event_file_bytes import some_events
from tests.unit.events.test_event_leftovers import files_under

pytestmark = pytest.mark.integration

ROTATION = Rotation(max_events=3)
"""Many small files: about two kills in three land inside a write, with its aside file."""
ROUNDS = 8


def write_forever(root: str, batch: int, events: list[Any]) -> None:
    writer = EventFileWriter(root, "s", "json", ROTATION)
    while True:
        for part in range(2):
            writer.write_part(batch, part, events[part::2], "keyed2")


def test_killed_writes_leave_nothing_once_their_batch_commits(db: Database, tmp_path: Path):
    events = some_events(db)
    writer = EventFileWriter(tmp_path, "s", "json", ROTATION)
    base = tmp_path / "s"
    rng = random.Random(17)
    context = multiprocessing.get_context("spawn")
    cut_short = 0
    for batch in range(1, ROUNDS + 1):
        worker = context.Process(target=write_forever, args=(str(tmp_path), batch, events))
        worker.start()
        deadline = time.monotonic() + 60
        while not any(f"-{batch:012d}-" in name for name in files_under(base)):
            assert time.monotonic() < deadline, "the attempt wrote nothing in 60 s"
            time.sleep(0.001)  # a poll, not a wait: leave the child the core
        time.sleep(rng.uniform(0, 0.05))  # a random point of its writes, not a wait for them
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(30)
        assert not worker.is_alive()
        cut_short += any(name.endswith(".tmp") and f"-{batch:012d}-" in name
                         for name in files_under(base))
        files = writer.write_part(batch, 0, events, "keyed1")
        writer.commit_batch(batch, files)
        listed = {str(part.path.relative_to(base)) for part in writer.committed_parts()}
        assert files_under(base) == listed
    assert cut_short >= 1, "no kill landed inside a write: the test proved nothing"
    assert sum(part.events for part in writer.committed_parts()) == ROUNDS * len(events)
