"""`cdcflow.table.snapshots`: a kept handle per table and thread, brought up to date with the
commits since, and never a stale one (AP-5 reads must see every committed change)."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from cdcflow.table import CdcTable, snapshots
from cdcflow.table.snapshots import newest, newest_manifest

ROWS = pa.table({"id": pa.array([1, 2], pa.int64())})


@pytest.fixture(autouse=True)
def _fresh_handles():
    snapshots.forget_all()
    yield
    snapshots.forget_all()


def _commits(path: Path, count: int, rows: pa.Table = ROWS) -> None:
    for _ in range(count):
        write_deltalake(str(path), rows, mode="append")


def test_the_kept_handle_follows_commits_made_elsewhere(tmp_path: Path):
    _commits(tmp_path / "t", 3)
    first = newest(tmp_path / "t")
    _commits(tmp_path / "t", 2)
    again = newest(tmp_path / "t")
    assert again is first  # kept, not loaded anew
    assert again.version() == DeltaTable(str(tmp_path / "t")).version() == 4
    assert again.to_pyarrow_table().num_rows == 10


@pytest.mark.parametrize("versions_after", [1, 3, 6])
def test_a_table_created_again_under_the_same_path_is_loaded_anew(tmp_path: Path,
                                                                   versions_after: int):
    """Fewer, as many and more versions than the handle held: never the old table's rows, and
    never the new table's commits laid over the old table's state."""
    _commits(tmp_path / "t", 3)
    assert newest(tmp_path / "t").to_pyarrow_table().num_rows == 6
    shutil.rmtree(tmp_path / "t")
    _commits(tmp_path / "t", versions_after, pa.table({"id": pa.array([7], pa.int64())}))
    found = newest(tmp_path / "t")
    assert found.version() == versions_after - 1
    assert found.to_pyarrow_table().column("id").to_pylist() == [7] * versions_after


def test_each_thread_has_its_own_handle(tmp_path: Path):
    _commits(tmp_path / "t", 1)
    mine = newest(tmp_path / "t")
    theirs: list[DeltaTable] = []
    thread = threading.Thread(target=lambda: theirs.append(newest(tmp_path / "t")))
    thread.start()
    thread.join()
    assert theirs and theirs[0] is not mine and theirs[0].version() == mine.version()


def test_a_thread_keeps_at_most_its_limit_of_handles(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(snapshots, "HANDLES_PER_THREAD", 2)
    for name in "abc":
        _commits(tmp_path / name, 1)
    first = newest(tmp_path / "a")
    newest(tmp_path / "b")
    assert newest(tmp_path / "a") is first  # used again: now the most recent
    newest(tmp_path / "c")  # drops b, the least recently used
    assert newest(tmp_path / "a") is first
    assert len(snapshots._handles()) == 2 and str(tmp_path / "b") not in snapshots._handles()


def test_the_manifest_follows_applies(tmp_path: Path):
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string())])
    table = CdcTable.create(tmp_path / "t", schema, ["id"])
    assert newest_manifest(table.root).files == ()
    table.connection().append([{"id": 1, "name": "a", "_CHANGE_TYPE": "UPSERT",
                                "_CHANGE_SEQUENCE_NUMBER": "1"}])
    table.apply()
    manifest = newest_manifest(table.root)
    assert len(manifest.files) == 1 and manifest.watermark is not None
    assert newest_manifest(table.root) is manifest  # the same version: read once
    table.connection().append([{"id": 1, "_CHANGE_TYPE": "DELETE",
                                "_CHANGE_SEQUENCE_NUMBER": "2"}])
    table.apply()
    assert newest_manifest(table.root).version > manifest.version
    assert table.lookup([(1,)]) == {}


def test_a_log_cleanup_that_left_the_old_commit_behind_does_not_hide_newer_ones(tmp_path: Path):
    """A cleanup deletes the commit files older than the newest checkpoint in no set order,
    and a killed one stops half-way: the handle's own commit file may stay while the next
    one is gone. The checkpoint tells that the handle is old."""
    path = tmp_path / "t"
    _commits(path, 5)
    held = newest(path)
    assert held.version() == 4
    _commits(path, 25)
    DeltaTable(str(path)).create_checkpoint()
    for version in range(5, 19):  # a cleanup cut short: 4.json is still there
        (path / "_delta_log" / f"{version:020d}.json").unlink()
    found = newest(path)
    assert found.version() == 29 and found.to_pyarrow_table().num_rows == 60
