"""Ctrl-C while `cdcflow run` is still starting Spark leaves no JVM behind.

pyspark's launcher, interrupted while it waits for the JVM, deletes the folder the JVM writes
its connection details to; that JVM then never exits. `session()` holds SIGINT until the
gateway is connected. Each run here is marked by a variable in its environment, which the
JVM and every other child inherit, so what is left of it is found in /proc whatever its
parent became. The interrupts come at random moments after the JVM has been spawned: Ctrl-C
while Python is still importing cdcflow, before any JVM, ends in Python's own traceback.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

MARK = "CDCFLOW_TEST_RUN_MARK"


def marked(mark: str, command: str | None = None) -> list[int]:
    """Pids of live processes whose environment holds `MARK=mark` (and whose command name is
    `command`, if given)."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, state = stat[stat.index("(") + 1:stat.rindex(")")], stat.rsplit(")", 1)[1].split()[0]
        if needle in environ.split(b"\0") and state != "Z" and command in (None, name):
            found.append(int(entry.name))
    return found


def interrupted_run(tmp_path: Path, delay: float) -> tuple[int, str, list[int]]:
    """Start `cdcflow run`, SIGINT it `delay` s after its JVM was spawned; its exit code, its
    output and the marked processes still alive 60 s after it exited (polled, not slept)."""
    mark = uuid.uuid4().hex
    log = tmp_path / f"run-{mark}.log"
    with open(log, "wb") as out:
        runner = subprocess.Popen(
            [sys.executable, "-m", "cdcflow.cli.main", "run", "--catalog",
             str(tmp_path / "catalog.db"), "--master", "local[1]"],
            env={**os.environ, MARK: mark}, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while not marked(mark, "java") and runner.poll() is None:
                assert time.monotonic() < deadline, "no JVM was spawned"
                time.sleep(0.05)
            time.sleep(delay)  # the moment to interrupt, not a wait for another process
            runner.send_signal(signal.SIGINT)
            code = runner.wait(timeout=120)
        finally:
            if runner.poll() is None:
                runner.kill()
    deadline = time.monotonic() + 60
    left = marked(mark)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = marked(mark)
    for pid in left:  # do not leave them to the rest of the suite
        os.kill(pid, signal.SIGKILL)
    return code, log.read_text(errors="replace"), left


def test_ctrl_c_while_spark_starts_leaves_no_jvm(tmp_path: Path):
    seed = random.randrange(1 << 30)
    moments = sorted(random.Random(seed).uniform(0.0, 5.0) for _ in range(3))
    for delay in moments:
        code, output, left = interrupted_run(tmp_path, delay)
        context = f"seed {seed}, SIGINT {delay:.2f} s after the JVM, exit {code}:\n{output[-2000:]}"
        assert not left, f"processes of the run outlived it: {left}; {context}"
        assert code in (0, 130), context
        assert "Traceback" not in output, context
        if code == 130:
            assert "runner stopped while Spark was starting" in output, context
