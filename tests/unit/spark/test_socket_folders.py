"""The private folders of the workers' Unix sockets (`worker_sockets`): a killed process runs
no exit handler, so the next session removes the folders of this user's processes that are
gone, and only those."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cdcflow.spark.session import SOCKET_FOLDER_PREFIX, remove_stale_socket_folders


def _folder(parent: Path, name: str) -> Path:
    folder = parent / f"{SOCKET_FOLDER_PREFIX}{name}"
    folder.mkdir()
    (folder / ".a-socket.sock").write_bytes(b"")
    return folder


def test_only_the_folders_of_processes_that_are_gone_are_removed(tmp_path: Path):
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    gone = _folder(tmp_path, f"{ended.pid}-k1ll3d")
    mine = _folder(tmp_path, f"{os.getpid()}-l1v3")
    parent_process = _folder(tmp_path, f"{os.getppid()}-l1v3")
    unnamed = _folder(tmp_path, "n0pid")
    other = tmp_path / "unrelated-123-x"
    other.mkdir()
    assert remove_stale_socket_folders(tmp_path) == [gone]
    assert not gone.exists()
    assert all(p.exists() for p in (mine, parent_process, unnamed, other))
