"""`cdcflow run` as the benchmarks start and stop it. Not a benchmark itself (no `bench_`
prefix)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

LOCAL_MASTER = ("--master", "local[2]")


def start_runner(folder: Path, options: tuple[str, ...] | list[str] = LOCAL_MASTER
                 ) -> subprocess.Popen[bytes]:
    """`cdcflow run` over `folder/catalog.db` with `options`, in a session of its own (so a
    signal reaches its JVM and workers too); its output goes to `folder/runner.log`."""
    with open(folder / "runner.log", "wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "cdcflow.cli.main", "run", "--catalog",
             str(folder / "catalog.db"), *options], start_new_session=True,
            stdout=log, stderr=subprocess.STDOUT)


def stop_runner(runner: subprocess.Popen[bytes]) -> None:
    """Ctrl-C to the runner's session, then wait for it to exit."""
    os.killpg(runner.pid, signal.SIGINT)
    runner.wait(120)


def batch_times(status: dict[str, Any]) -> str:
    """A stream's last batch, from its status: cdcflow's write time and rate, Spark's
    addBatch and whole trigger."""
    timing = status.get("batch_timing") or {}
    spark = timing.get("spark_ms") or {}
    rate = float(status.get("throughput_rows_per_second") or 0)
    return (f"write {timing.get('write_ms', '?')} ms at {rate:,.0f}/s, addBatch "
            f"{spark.get('addBatch', '?')} ms, trigger {spark.get('triggerExecution', '?')} ms")
