"""Every attempt at an event file writes the same bytes (EV-2, exactly once): a replayed
batch, or a writer its killed driver left running, may replace a file after the batch's
manifest lists it with its sha256, and the file read back must still be the one listed."""

from __future__ import annotations

import hashlib
import io
import re
from pathlib import Path

import pytest

from cdcflow import Database
from cdcflow.errors import InvalidArgument
from cdcflow.events.avro_format import read_avro
from cdcflow.events.files import EventFileWriter, Rotation
from tests.unit.events.test_events import events_of

pytestmark = pytest.mark.unit


def some_events(db: Database) -> list:
    db.ddl("CREATE TABLE T (K INT64 NOT NULL, V STRING(MAX), W FLOAT64) PRIMARY KEY (K)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL OPTIONS (value_capture_type = 'NEW_ROW')")
    for start in range(0, 40, 8):
        with db.transaction() as tx:
            for key in range(start, start + 8):
                tx.insert_or_update("T", {"K": key % 13, "V": f"v{key}", "W": key / 7})
    return events_of(db, "S")


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_two_attempts_at_a_part_write_the_same_bytes(db: Database, tmp_path: Path, fmt: str):
    events = some_events(db)
    rotation = Rotation(max_events=15)  # several files of one part
    first = EventFileWriter(tmp_path / "first", "s", fmt, rotation).write_part(3, 1, events)
    second = EventFileWriter(tmp_path / "second", "s", fmt, rotation).write_part(
        3, 1, list(reversed(events)))
    assert len(first) == 3
    assert first == second  # paths, counts and sha256 alike
    for listed in first:
        data = (tmp_path / "first" / "s" / listed["path"]).read_bytes()
        assert data == (tmp_path / "second" / "s" / listed["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == listed["sha256"]


def test_an_avro_file_s_sync_marker_comes_from_its_name(db: Database, tmp_path: Path):
    """The marker is the container's last 16 bytes: the same for one name, not for two."""
    events = some_events(db)
    writer = EventFileWriter(tmp_path, "s", "avro")
    markers = []
    for batch in (1, 1, 2):  # each file read as soon as it is written: batch 1's is written twice
        (part,) = writer.write_part(batch, 0, events)
        markers.append((tmp_path / "s" / part["path"]).read_bytes()[-16:])
    assert markers[0] == markers[1]
    assert markers[0] != markers[2]
    assert len(writer.committed_parts()) == 0  # nothing listed until a manifest commits


def test_a_part_s_name_tells_how_the_batch_was_cut(db: Database, tmp_path: Path):
    """Part 1 of a batch cut in 2 shares holds other events than part 1 of one cut in 3: an
    attempt laid out otherwise writes other files, never over the ones a manifest lists."""
    events = some_events(db)
    writer = EventFileWriter(tmp_path, "s", "json")
    two = writer.write_part(5, 1, events[::2], "keyed2")
    three = writer.write_part(5, 1, events[1::2], "keyed3")
    assert [f["path"].split("/")[-1] for f in two] == [
        "batch-000000000005-keyed2-p00001-0000.jsonl"]
    assert {f["path"] for f in two}.isdisjoint(f["path"] for f in three)
    for listed in two:
        data = (tmp_path / "s" / listed["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == listed["sha256"]


@pytest.mark.parametrize("layout", ["keyed-2", "../x", "k 2"])
def test_a_layout_that_is_not_a_plain_word_is_refused(db: Database, tmp_path: Path,
                                                     layout: str):
    events = some_events(db)
    with pytest.raises(InvalidArgument, match=f"part layout {re.escape(repr(layout))} must be "
                                              "letters and digits"):
        EventFileWriter(tmp_path / "events", "s", "json").write_part(5, 1, events, layout)
    assert not (tmp_path / "events").exists()


@pytest.mark.parametrize("fmt", ["avro", "json"])
@pytest.mark.parametrize("names", [("Orders", "orders"), ("Caf\u00e9", "Cafe\u0301")])
def test_objects_one_to_a_case_folding_filesystem_keep_their_own_files(
        db: Database, tmp_path: Path, fmt: str, names: tuple[str, str]):
    """EV-2, exactly once. A filesystem that folds case (macOS's by default) gives two objects
    whose names differ only in letter case, or in Unicode normalisation, one folder. Here a
    link makes the second name reach the first's folder, as such a filesystem does. The two
    objects' files in one part of a batch must not share a name there, where one would
    overwrite the other: every event of both is read back from what the manifest lists."""
    events = some_events(db)
    both = ([e._replace(object=names[0]) for e in events[:25]]
            + [e._replace(object=names[1]) for e in events[25:]])
    base = tmp_path / "s"
    (base / names[0]).mkdir(parents=True)
    if not (base / names[1]).exists():  # a filesystem that folds needs no link
        (base / names[1]).symlink_to(names[0])
    writer = EventFileWriter(tmp_path, "s", fmt, Rotation(max_events=7))
    writer.commit_batch(1, writer.write_part(1, 0, both, "driver"))

    read = []
    for part in writer.committed_parts():
        found = (part.json_events() if fmt == "json"
                 else [e.to_json() for e in read_avro(io.BytesIO(part.read_bytes()))])
        read += [(e["object"], e["uuid"]) for e in found]
    assert sorted(read) == sorted((e.object, e.uuid) for e in both)
    parts = writer.committed_parts()
    assert len(parts) > 2 and len({p.path.name for p in parts}) == len(parts)
