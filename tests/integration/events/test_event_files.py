"""Event files: layout, atomic files with a manifest per batch, rotation, and exactly once
per batch id across a writer killed mid-batch and restarted."""

from __future__ import annotations

import io
import multiprocessing
import os
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cdcflow.errors import InvalidArgument
from cdcflow.events.avro_format import read_avro
from cdcflow.events.files import EventFileWriter, Rotation, read_json_events
from cdcflow.model.events import Event, change_uuid
from cdcflow.model.records import ColumnTypeInfo
from cdcflow.model.types import ColumnType

pytestmark = pytest.mark.integration
COLUMNS = (ColumnTypeInfo("id", ColumnType("INT64"), True, 1),
           ColumnTypeInfo("note", ColumnType("STRING"), False, 2))
T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def make_events(batch: int, count: int, table: str = "Orders") -> list[Event]:
    return [Event("s1", "embedded-cdc-changestream", table, "k1",
                  change_uuid("s1", batch, i), T0, T0 + timedelta(seconds=i * 7),
                  (i,), {"table": table, "is_deleted": False}, {"id": i, "note": "x" * 50},
                  COLUMNS) for i in range(count)]


def test_layout_rotation_and_manifests(tmp_path: Path):
    """EV-1: events are written under their stream, then under their object
    (`<root>/<stream>/<object>/...`); rotation and one manifest per batch."""
    writer = EventFileWriter(tmp_path, "s1", "json", Rotation(max_events=4, max_seconds=20))
    files = writer.write_batch(0, make_events(0, 20) + make_events(0, 3, "Other"))
    assert all(Path(tmp_path / "s1" / f).exists() for f in files)
    assert {f.split("/")[0] for f in files} == {"Orders", "Other"}
    assert "Orders/2026/11/21/10/00/batch-000000000000-p00000-0000.jsonl" in files
    assert any("/10/01/" in f or "/10/02/" in f for f in files)  # minute folders
    counts = [len(read_json_events(tmp_path / "s1" / f)) for f in files]
    assert sum(counts) == 23 and max(counts) <= 4  # rotation by count and time span
    assert writer.write_batch(0, make_events(0, 20)) == []  # a replay writes nothing
    assert writer.committed_files() == [tmp_path / "s1" / f for f in files]
    assert not list((tmp_path / "s1").rglob(".*.tmp"))
    with pytest.raises(InvalidArgument, match="format"):
        EventFileWriter(tmp_path, "s1", "csv")
    with pytest.raises(InvalidArgument, match="plain folder"):
        EventFileWriter(tmp_path, "../up")


def test_avro_files(tmp_path: Path):
    writer = EventFileWriter(tmp_path, "s1", "avro", Rotation(max_events=1000))
    (name,) = writer.write_batch(3, make_events(3, 5))
    with open(tmp_path / "s1" / name, "rb") as handle:
        back = list(read_avro(io.BytesIO(handle.read())))
    assert [e.payload["id"] for e in back] == [0, 1, 2, 3, 4]


def slow_writer(root: str, batches: int) -> None:
    writer = EventFileWriter(root, "s1", "json", Rotation(max_events=50))
    for batch in range(batches):
        writer.write_batch(batch, make_events(batch, 400))
        time.sleep(0.01)


def test_killed_writer_restarted_writes_every_event_once(tmp_path: Path):
    context = multiprocessing.get_context("spawn")
    process = context.Process(target=slow_writer, args=(str(tmp_path), 30))
    process.start()
    manifests = tmp_path / "s1" / "_manifests"
    deadline = time.monotonic() + 60
    while len(list(manifests.glob("*.json"))) < 5 and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(process.pid, signal.SIGKILL)
    process.join()
    written = len(list(manifests.glob("*.json")))
    assert 5 <= written < 30
    slow_writer(str(tmp_path), 30)  # the restart replays every batch
    writer = EventFileWriter(tmp_path, "s1")
    uuids = [e["uuid"] for f in writer.committed_files() for e in read_json_events(f)]
    assert len(uuids) == len(set(uuids)) == 30 * 400
    every_file = [p for p in (tmp_path / "s1").rglob("*.jsonl")]
    assert sorted(every_file) == sorted(writer.committed_files())  # no stray files
