"""What earlier attempts at an event batch left beside its files goes when the batch commits
(EV-2, exactly once): aside files of killed writes, and the files of an attempt that cut the
batch otherwise, which a reader listing the folders would count twice. Nothing of another
batch, committed or not, is touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdcflow import Database
from cdcflow.events import files
from cdcflow.events.files import EventFileWriter, Rotation
from cdcflow.events.leftovers import batch_file_name, remove_leftovers, written_name
from tests.unit.events.test_event_file_bytes import some_events

pytestmark = pytest.mark.unit

ASIDE = "0123456789abcdef" * 2


def files_under(base: Path) -> set[str]:
    return {str(p.relative_to(base)) for p in base.rglob("*")
            if p.is_file() and "_manifests" not in p.parts}


def aside_of(base: Path, listed: dict, name: str) -> str:
    """An aside file as a write killed before its move leaves it, beside a listed file."""
    folder = (base / listed["path"]).parent
    (folder / f".{name}.{ASIDE}.tmp").write_bytes(b'{"half": ')
    return str((folder / f".{name}.{ASIDE}.tmp").relative_to(base))


def test_a_commit_removes_what_earlier_attempts_at_its_batch_left(db: Database,
                                                                  tmp_path: Path):
    events = some_events(db)
    writer = EventFileWriter(tmp_path, "s", "json", Rotation(max_events=7))
    base = tmp_path / "s"
    before = writer.write_part(6, 0, events, "driver")
    writer.commit_batch(6, before)
    half = len(events) // 2  # attempt 1 at batch 7, cut in two shares, then killed
    cut_in_two = [*writer.write_part(7, 0, events[:half], "keyed2"),
                  *writer.write_part(7, 1, events[half:], "keyed2")]
    killed = aside_of(base, cut_in_two[0], "batch-000000000007-keyed3-p00000-0001.jsonl")
    later = writer.write_part(8, 0, events, "driver")  # batch 8: written, not committed
    later_aside = aside_of(base, later[0], "batch-000000000008-driver-p00000-0009.jsonl")
    on_disk = files_under(base)
    assert killed in on_disk and {f["path"] for f in cut_in_two} <= on_disk

    committed = writer.write_part(7, 0, events, "keyed3")  # attempt 2, cut in three
    writer.commit_batch(7, committed)

    assert files_under(base) == ({f["path"] for f in [*before, *committed, *later]}
                                 | {later_aside})
    assert sum(part.events for part in writer.committed_parts()) == 2 * len(events)


def test_a_backfill_chunk_s_commit_leaves_the_other_chunks_alone(db: Database, tmp_path: Path):
    """Backfill keys hold dashes; chunk 1's files must not be taken for chunk 12's or the
    reverse."""
    events = some_events(db)
    writer = EventFileWriter(tmp_path, "s", "json")
    base = tmp_path / "s"
    twelve = writer.write_part("backfill-T-k-000012", 0, events)  # written, not committed
    one = writer.write_part("backfill-T-k-000001", 0, events)
    killed = aside_of(base, one[0], "batch-backfill-T-k-000001-p00000-0000.jsonl")
    other = aside_of(base, one[0], "batch-backfill-T-k-000012-p00000-0000.jsonl")
    assert killed in files_under(base)
    writer.commit_batch("backfill-T-k-000001", one)
    assert files_under(base) == {f["path"] for f in [*twelve, *one]} | {other}


@pytest.mark.parametrize(("key", "name", "ours"), [
    ("000000000007", "batch-000000000007-keyed3-p00001-0000.jsonl", True),
    ("000000000007", "batch-000000000007-hashed4-p00003-0012.avro", True),
    ("000000000007", "batch-000000000007-p00000-0000.jsonl", True),
    ("000000000007", "batch-000000000070-keyed3-p00001-0000.jsonl", False),
    ("000000000007", "batch-000000000007-keyed3-p00001-0000.jsonl.bak", False),
    ("000000000007", "batch-000000000007-key-ed-p00001-0000.jsonl", False),
    ("backfill-T-k-000001", "batch-backfill-T-k-000001-p00000-0000.jsonl", True),
    ("backfill-T-k-000001", "batch-backfill-T-k-000001-2-p00000-0000.jsonl", False),
    ("backfill-T-k-000001", "batch-backfill-T-k-0000012-p00000-0000.jsonl", False),
    ("1000000000000", "batch-1000000000000-keyed3-p100000-10000.jsonl", True),
    ("1000000000000", "batch-100000000000-keyed3-p00001-0000.jsonl", False),
])
def test_which_names_are_a_batch_s_files(key: str, name: str, ours: bool):
    assert bool(batch_file_name(key).fullmatch(name)) is ours


def test_an_aside_name_gives_the_file_it_was_to_become():
    assert written_name(f".batch-1-p00000-0000.jsonl.{ASIDE}.tmp") == "batch-1-p00000-0000.jsonl"
    assert written_name(".batch-1-p00000-0000.jsonl.notrandom.tmp") == \
        ".batch-1-p00000-0000.jsonl.notrandom.tmp"  # not an aside name: left as it is
    assert written_name("batch-1-p00000-0000.jsonl") == "batch-1-p00000-0000.jsonl"


def test_a_listed_file_stays_when_its_folder_is_reached_under_another_name(tmp_path: Path):
    """Two objects whose folders are one on the disk (names that differ in case only, on a
    filesystem that folds case; a symlink stands in for that here): each folder's sweep sees
    the other's listed file under its own spelling, and must keep it."""
    real = tmp_path / "Orders" / "2026"
    real.mkdir(parents=True)
    (tmp_path / "orders").symlink_to(tmp_path / "Orders")
    for index in range(3):
        (real / f"batch-000000000007-driver-p00000-000{index}.jsonl").write_bytes(b"{}\n")
    removed = remove_leftovers(tmp_path, "000000000007", [
        "Orders/2026/batch-000000000007-driver-p00000-0000.jsonl",
        "orders/2026/batch-000000000007-driver-p00000-0001.jsonl"])
    assert sorted(p.name for p in real.iterdir()) == [
        "batch-000000000007-driver-p00000-0000.jsonl",
        "batch-000000000007-driver-p00000-0001.jsonl"]
    assert [p.name for p in removed] == ["batch-000000000007-driver-p00000-0002.jsonl"]


def test_a_sweep_that_cannot_read_a_folder_removes_nothing_and_does_not_fail(tmp_path: Path):
    assert remove_leftovers(tmp_path, "000000000007",
                            ["Gone/2026/batch-000000000007-driver-p00000-0000.jsonl"]) == []


def test_a_replay_removes_what_a_commit_stopped_before_removing(db: Database, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch):
    """The driver died between a batch's manifest and the end of its sweep: the replay
    finds the manifest, writes nothing, and sweeps (`pipeline.run_batch`)."""
    events = some_events(db)
    writer = EventFileWriter(tmp_path, "s", "json", Rotation(max_events=7))
    base = tmp_path / "s"
    killed = writer.write_part(7, 0, events, "keyed2")
    committed = writer.write_part(7, 0, events, "keyed3")
    monkeypatch.setattr(files, "remove_leftovers", lambda *args: [])  # the driver died here
    writer.commit_batch(7, committed)
    monkeypatch.undo()
    assert {f["path"] for f in killed} <= files_under(base)
    assert writer.remove_leftovers(8) == []  # no manifest: nothing to go by
    assert len(writer.remove_leftovers(7)) == len(killed)
    assert files_under(base) == {f["path"] for f in committed}


def test_unfinished_manifests_go_and_committed_ones_stay(db: Database, tmp_path: Path):
    """A driver killed inside `commit_batch` leaves its manifest's aside file; the next
    query's start removes it (and only it): the batch counts as not written, so nothing
    is lost, and the folder stops keeping what no reader needs."""
    writer = EventFileWriter(tmp_path, "s", "json", Rotation(max_events=7))
    events = some_events(db)
    writer.commit_batch(1, writer.write_part(1, 0, events, "driver"))
    manifests = tmp_path / "s" / "_manifests"
    killed = manifests / f".batch-000000000002.json.{ASIDE}.tmp"
    killed.write_bytes(b'{"batch": "0000')
    others = [manifests / f".notes.json.{ASIDE}.tmp", manifests / ".batch-000000000003.json.tmp",
              manifests / f".batch-000000000004.jsonl.{ASIDE}.tmp"]
    for path in others:
        path.write_bytes(b"not a manifest's aside file")
    assert writer.remove_unfinished_manifests() == [killed]
    assert sorted(manifests.iterdir()) == sorted([writer.manifest_path(1), *others])
    assert not writer.is_committed(2)
    assert sum(part.events for part in writer.committed_parts()) == len(events)
    assert writer.remove_unfinished_manifests() == []
    assert EventFileWriter(tmp_path, "t", "json").remove_unfinished_manifests() == []
