"""Attempts at an event batch SIGKILLed at random points of their writes, then the batch
written again and committed by an attempt cut otherwise (a restarted query on a cluster of
another size): the folders then hold exactly the files the manifests list, and every event
reads back once (EV-2). Before, the aside files of killed writes stayed for good, and the
killed attempt's files stayed beside the committed ones. Drivers killed inside the commit
leave aside files of manifests, which the next query's start removes."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import random
import signal
import time
from collections.abc import Callable
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
COMMIT_ROUNDS = 16
"""A kill lands inside a manifest's write about one time in three."""


def write_forever(root: str, batch: int, events: list[Any]) -> None:
    writer = EventFileWriter(root, "s", "json", ROTATION)
    while True:
        for part in range(2):
            writer.write_part(batch, part, events[part::2], "keyed2")


def commit_forever(root: str, first: int, files: list[dict[str, Any]]) -> None:
    writer = EventFileWriter(root, "s", "json", ROTATION)
    for batch in itertools.count(first):
        writer.commit_batch(batch, files)


def kill_once_started(target: Callable[..., None], args: tuple[Any, ...],
                      started: Callable[[], bool], rng: random.Random, span: float) -> None:
    """Run `target(*args)` in a process of its own; once `started()`, SIGKILL it at a random
    point of the next `span` seconds."""
    worker = multiprocessing.get_context("spawn").Process(target=target, args=args)
    worker.start()
    deadline = time.monotonic() + 60
    while not started():
        assert time.monotonic() < deadline, f"{target.__name__} did nothing in 60 s"
        time.sleep(0.001)  # a poll, not a wait: leave the child the core
    time.sleep(rng.uniform(0, span))  # a random point of its writes, not a wait for them
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(30)
    assert not worker.is_alive()


def test_killed_writes_leave_nothing_once_their_batch_commits(db: Database, tmp_path: Path):
    events = some_events(db)
    writer = EventFileWriter(tmp_path, "s", "json", ROTATION)
    base = tmp_path / "s"
    rng = random.Random(17)
    cut_short = 0
    for batch in range(1, ROUNDS + 1):
        kill_once_started(write_forever, (str(tmp_path), batch, events),
                          lambda b=batch: any(f"-{b:012d}-" in n for n in files_under(base)),
                          rng, 0.05)
        cut_short += any(name.endswith(".tmp") and f"-{batch:012d}-" in name
                         for name in files_under(base))
        files = writer.write_part(batch, 0, events, "keyed1")
        writer.commit_batch(batch, files)
        listed = {str(part.path.relative_to(base)) for part in writer.committed_parts()}
        assert files_under(base) == listed
    assert cut_short >= 1, "no kill landed inside a write: the test proved nothing"
    assert sum(part.events for part in writer.committed_parts()) == ROUNDS * len(events)


def test_killed_commits_leave_no_manifest_aside_once_a_query_starts(db: Database,
                                                                     tmp_path: Path):
    """Drivers SIGKILLed at random points of `commit_batch`, round after round: what they
    left in `_manifests` is whole manifests and aside files, which the next query's start
    (`remove_unfinished_manifests`) removes; every manifest left reads, and each lists the
    batch's files."""
    writer = EventFileWriter(tmp_path, "s", "json", ROTATION)
    files = writer.write_part(1, 0, some_events(db), "driver")
    manifests = tmp_path / "s" / "_manifests"
    rng = random.Random(29)
    cut_short, first = 0, 1
    for _ in range(COMMIT_ROUNDS):
        kill_once_started(commit_forever, (str(tmp_path), first, files),
                          lambda f=first: len(list(manifests.glob("batch-*.json"))) >= f,
                          rng, 0.02)
        asides = [p for p in manifests.iterdir() if p.name.endswith(".tmp")]
        cut_short += bool(asides)
        assert sorted(writer.remove_unfinished_manifests()) == sorted(asides)
        whole = sorted(manifests.iterdir())
        assert [p.name for p in whole] == [f"batch-{n:012d}.json" for n in range(1, len(whole) + 1)]
        first = len(whole) + 1
    assert cut_short >= 1, "no kill landed inside a manifest's write: the test proved nothing"
    assert len(writer.committed_parts()) == (first - 1) * len(files)
