"""The class archive with real JVMs (issue 14: a killed runner starts again sooner): the one
`cdcflow prepare` makes is mapped by every new session's JVM, and a damaged one is ignored
by the JVM, whose session starts and works as it would without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cdcflow.spark.class_archive import DRIVER_OPTIONS_VARIABLE, archive_path

pytestmark = pytest.mark.integration

SESSION_REPORT = """
import json, sys
from cdcflow.spark import session
from cdcflow.spark.class_archive import archive_path
spark = session("archive-check", master="local[1]")
jvm = spark.sparkContext._gateway.proc.pid
with open(f"/proc/{jvm}/maps") as maps:
    mapped = str(archive_path()) in maps.read()
with open(f"/proc/{jvm}/cmdline") as command:
    c1_only = "-XX:TieredStopAtLevel=1" in command.read().split("\\0")
print(json.dumps({"mapped": mapped, "c1_only": c1_only, "count": spark.range(1000).count()}))
"""


def _session_report(env: dict[str, str]) -> dict[str, object]:
    """Start a session in a new process; whether its JVM mapped the archive, whether it
    compiles with C1 only (a local master's default), and a count."""
    result = subprocess.run([sys.executable, "-c", SESSION_REPORT], env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    report: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


def _environment(**changes: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if key != DRIVER_OPTIONS_VARIABLE}
    return env | changes


def test_a_new_session_maps_the_archive_prepare_made():
    command = [str(Path(sys.executable).parent / "cdcflow"), "prepare"]
    made = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    assert made.returncode == 0, made.stdout + made.stderr
    assert str(archive_path()) in made.stdout
    assert _session_report(_environment()) == {"mapped": True, "c1_only": True, "count": 1000}


def test_a_damaged_archive_is_ignored_and_the_session_works(tmp_path: Path):
    env = _environment(XDG_CACHE_HOME=str(tmp_path))
    where = subprocess.run(
        [sys.executable, "-c",
         "from cdcflow.spark.class_archive import archive_path; print(archive_path())"],
        env=env, capture_output=True, text=True, check=True).stdout.strip()
    damaged = Path(where)
    assert damaged.parent == tmp_path / "cdcflow"
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(b"\x00not an archive" * 1000)
    damaged.chmod(0o444)
    assert _session_report(env) == {"mapped": False, "c1_only": True, "count": 1000}
