"""Two processes writing the same event file at once (a replayed task and one its killed
driver left running) each put a whole file in place and neither fails; a reader never sees
a part of one. With one shared aside name, one writer moved the other's half-written file
into place, and the other's move found nothing to move."""

from __future__ import annotations

import hashlib
import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest

from cdcflow.events.files import _atomic_write

pytestmark = pytest.mark.integration

DATA = bytes(range(256)) * 8192  # 2 MiB: long enough a write for the two to overlap


def write_often(path: str, times: int, start: Any) -> None:
    start.wait(60)  # both at once: a spawned process takes longer to start than its writes
    for _ in range(times):
        _atomic_write(Path(path), DATA)


def test_two_writers_of_one_file_each_move_a_whole_file(tmp_path: Path):
    path = tmp_path / "Accounts" / "2026-11-28T10:00" / "batch-000000000007-p00000-0000.avro"
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(2)
    writers = [context.Process(target=write_often, args=(str(path), 60, start))
               for _ in range(2)]
    for writer in writers:
        writer.start()
    whole = hashlib.sha256(DATA).hexdigest()
    seen = set()
    deadline = time.monotonic() + 120
    while any(w.is_alive() for w in writers):
        assert time.monotonic() < deadline, "the writers did not finish"
        if path.exists():
            seen.add(hashlib.sha256(path.read_bytes()).hexdigest())
    assert [w.exitcode for w in writers] == [0, 0]
    assert seen <= {whole}, "a reader saw a file that was not whole"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == whole
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no aside file stays
