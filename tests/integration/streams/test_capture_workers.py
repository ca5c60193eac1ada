"""Capture workers: a real capture process appending to a real change log is SIGKILLed at
random points; the supervisor notices each death, restarts it with a doubling backoff (reset
once a worker appends), and the worker resumes from the position stored with its last
append, so every source transaction is in the log exactly once. The status shows the
worker's position and lag."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cdcflow.clock import SYSTEM_CLOCK
from cdcflow.follow import follow_change_stream
from cdcflow.model.changes import SourceChange, SourceTransaction
from cdcflow.model.records import ColumnTypeInfo
from cdcflow.model.source import SourceMetadata
from cdcflow.model.types import ColumnType
from cdcflow.store.changelog import ChangeLog
from cdcflow.streams.workers import CaptureWorkers, capture_status

pytestmark = pytest.mark.integration
TYPES = (ColumnTypeInfo("id", ColumnType("INT64"), True, 1),
         ColumnTypeInfo("note", ColumnType("STRING"), False, 2))


def journal_capture(log_path: str, journal: str) -> None:
    """A capture worker over a journal file (one JSON transaction per line): it resumes after
    the line stored as its position and appends each new line with the next position."""
    log = ChangeLog.open(log_path)
    stored = log.position("journal")
    after = None if stored is None else stored.position
    line_number = 0 if after is None else int(after["line"])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.is_set():
        with open(journal) as lines:
            pending = lines.readlines()[line_number:]
        for text in pending:
            if not text.endswith("\n"):
                break  # a line still being written
            ids = json.loads(text)
            changes = tuple(SourceChange("journal", "INSERT", {"id": i}, {"note": f"n{i}"}, {},
                                         TYPES, position={"lsn": f"0/{i:X}"}) for i in ids)
            metadata = SourceMetadata("postgres-cdc-wal", datetime.now(UTC),
                                      str(line_number), {})
            position = {"line": line_number + 1}
            log.append("journal", SourceTransaction(metadata, changes), after, position)
            after, line_number = position, line_number + 1
        time.sleep(0.005)


def test_killed_workers_are_restarted_with_backoff_and_resume_exactly(tmp_path: Path):
    log_path = str(tmp_path / "journal.log")
    ChangeLog.open(log_path).ensure_change_stream("changes")
    journal = tmp_path / "journal.jsonl"
    journal.write_text("")
    deaths: list[str] = []
    workers = CaptureWorkers(SYSTEM_CLOCK, lambda name, message, _: deaths.append(message),
                             backoff_seconds=0.2, healthy_seconds=600)
    rng = random.Random(3)
    transactions = 0
    for kill in range(6):
        for _ in range(rng.randint(20, 60)):  # the source keeps committing
            with open(journal, "a") as out:
                out.write(json.dumps([transactions * 10 + k for k in range(3)]) + "\n")
            transactions += 1
            workers.ensure("s", journal_capture, (log_path, str(journal)))
            time.sleep(rng.uniform(0, 0.01))
        info = workers.info("s")
        deadline = time.monotonic() + 60
        while info is None or not info["alive"]:  # restarted after its backoff
            assert time.monotonic() < deadline, deaths
            workers.ensure("s", journal_capture, (log_path, str(journal)))
            time.sleep(0.01)
            info = workers.info("s")
        os.kill(info["pid"], signal.SIGKILL)  # at a random point of its work
        deadline = time.monotonic() + 30
        while len(deaths) <= kill:
            assert time.monotonic() < deadline
            workers.ensure("s", journal_capture, (log_path, str(journal)))
            time.sleep(0.01)
    deadline = time.monotonic() + 60
    log = ChangeLog.open(log_path)
    while (log.position("journal") or None) is None or \
            log.position("journal").position != {"line": transactions}:  # type: ignore[union-attr]
        assert time.monotonic() < deadline, log.position("journal")
        workers.ensure("s", journal_capture, (log_path, str(journal)))
        time.sleep(0.05)
    assert workers.info("s")["deaths_in_a_row"] >= 6  # type: ignore[index]
    workers.appended("s", "1970-01-01T00:00:00Z")  # appended before this worker began
    assert workers.info("s")["deaths_in_a_row"] >= 6  # type: ignore[index]
    with open(journal, "a") as out:  # one this worker appends: its run of deaths is over
        out.write(json.dumps([transactions * 10 + k for k in range(3)]) + "\n")
    transactions += 1
    while log.position("journal").position != {"line": transactions}:  # type: ignore[union-attr]
        assert time.monotonic() < deadline, log.position("journal")
        workers.ensure("s", journal_capture, (log_path, str(journal)))
        time.sleep(0.05)
    status = capture_status(log_path, "journal", SYSTEM_CLOCK)
    workers.appended("s", status["appended_at"])
    assert workers.info("s")["deaths_in_a_row"] == 0  # type: ignore[index]
    workers.stop_all()
    records = follow_change_stream(log, "changes", log.earliest_readable("changes"),
                                   log.current_timestamp()).records
    ids = sorted(m.keys["id"] for r in records for m in r.mods)
    assert ids == sorted(t * 10 + k for t in range(transactions) for k in range(3))
    delays = [float(m.split("restarting in ")[1].split(" s")[0]) for m in deaths]
    assert delays[:4] == [0.2, 0.4, 0.8, 1.6]  # doubling while deaths come in a row
    assert status["position"] == {"line": transactions}
    assert status["lag_seconds"] is not None and 0 <= status["lag_seconds"] < 30
    assert status["idle_seconds"] >= 0
