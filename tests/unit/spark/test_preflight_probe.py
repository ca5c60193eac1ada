"""What each executor task of the storage-root probe reports (issue 15): the driver's file
read and its own written, or why not, naming its host."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from cdcflow.spark.preflight import _probe_on_executor

pytestmark = pytest.mark.unit


def test_a_shared_writable_root_passes(tmp_path: Path):
    (tmp_path / "marker").write_text("token")
    assert list(_probe_on_executor(str(tmp_path), "marker", "token", iter([3]))) == [
        (socket.gethostname(), "", 0)]
    assert (tmp_path / "marker-3").read_text() == "token"


def test_a_root_without_the_drivers_file_is_not_shared(tmp_path: Path):
    [(host, problem, number)] = _probe_on_executor(str(tmp_path), "marker", "t", iter([0]))
    assert host == socket.gethostname() and number == 0
    assert problem == "can't read the driver's probe file: No such file or directory"


def test_a_root_with_another_file_there_is_another_folder(tmp_path: Path):
    (tmp_path / "marker").write_text("an old token")
    [(_, problem, _)] = _probe_on_executor(str(tmp_path), "marker", "token", iter([0]))
    assert problem == "sees another folder at this path than the driver does"
    assert not (tmp_path / "marker-0").exists()
