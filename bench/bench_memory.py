"""Memory of `cdcflow run` over a long run (issue 11, goal 6: RSS stays flat over 30 minutes).

The stream of bench_latency (embedded source, a CDC table and JSON event files, trigger
0.01 s) runs in `cdcflow run` while bench_latency's writer commits --rate changes/s. Every
--sample-seconds the resident memory (VmRSS) of the runner's whole process tree is read from
/proc: the runner (the Python driver), the Spark JVM, and the Python workers; parents are
found by scanning /proc/*/stat. Sampling begins once the stream is RUNNING and a first batch
is visible in the CDC table and the event files; the measured window is the --minutes after
a --warmup-seconds warm-up, with the writer running throughout. The baseline is the start
figure measured in the same run: the median of the window's first three samples. Printed per
part (total, driver, JVM, workers): start, end (median of the last three), peak, end/start and
the slope of a least-squares line over the window's second half in MiB per 10 minutes; then a
coarse timeline, the changes the writer committed and how far behind the pipeline was.
Aim: end/start <= 1.10 and a second-half slope near 0.
Usage: python bench/bench_memory.py [--minutes 30] [--rate 1000] [--sample-seconds 10]
                                    [--warmup-seconds 60]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_latency import prepare, write
from cdcflow.store.database import Database
from cdcflow.streams.catalog import Catalog
from cdcflow.table import CdcTable
from pgkit import logged_changes, wait_until
from runkit import start_runner

PARTS = ("total", "driver", "jvm", "workers")
SEED_ID = 1_000_000
"""The key of the one row committed before the writer starts, so a first batch shows."""
AIM_RATIO = 1.10
CATCH_UP_SECONDS = 600


@dataclass(frozen=True, slots=True)
class Sample:
    """Resident MiB per part of the runner's process tree, `seconds` after sampling began."""

    seconds: float
    mib: dict[str, float]
    processes: dict[str, int]


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command name) of every process, from /proc/*/stat."""
    table: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it ended while we looked
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:]
        table[int(entry.name)] = (int(rest.split()[1]), name)
    return table


def descendants(root: int, table: dict[int, tuple[int, str]]) -> list[int]:
    """`root` and every process below it."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def rss_mib(pid: int) -> float:
    """VmRSS of `pid` in MiB; 0 when it has ended."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def sample(runner: int, seconds: float) -> Sample:
    table = process_table()
    mib, processes = dict.fromkeys(PARTS, 0.0), dict.fromkeys(PARTS, 0)
    for pid in descendants(runner, table):
        part = "driver" if pid == runner else "jvm" if table[pid][1] == "java" else "workers"
        for key in (part, "total"):
            mib[key] += rss_mib(pid)
            processes[key] += 1
    return Sample(seconds, mib, processes)


def slope_per_10_minutes(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of (seconds, MiB) points, in MiB per 10 minutes."""
    if len(points) < 2:
        return 0.0
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        return 0.0
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread * 600


def alive(runner: subprocess.Popen[bytes], folder: Path) -> bool:
    """True while the runner runs; an error with the end of its log once it has stopped."""
    if runner.poll() is None:
        return True
    tail = (folder / "runner.log").read_text(errors="replace")[-3000:]
    raise RuntimeError(f"`cdcflow run` exited with {runner.returncode}:\n{tail}")


def first_batch_visible(folder: Path, catalog: Catalog, runner: subprocess.Popen[bytes]) -> None:
    """Commit the seed row; wait until it is in the CDC table and an event manifest."""
    with Database.open(str(folder / "shop.db"), create=False).transaction() as tx:
        tx.insert_or_update("Accounts", {"Id": SEED_ID, "Owner": "seed", "Balance": 0})
    table = wait_until(lambda: alive(runner, folder) and (
        folder / "warehouse" / "Accounts").exists() and CdcTable.open(
        folder / "warehouse" / "Accounts"), 300, "the CDC table of Accounts")
    manifests = folder / "events" / "latency" / "_manifests"
    wait_until(lambda: alive(runner, folder) and table.lookup([(SEED_ID,)])
               and any(manifests.glob("batch-*.json")), 300,
               "the first batch in the CDC table and the event files")


def sample_while(writer: Any, runner: subprocess.Popen[bytes], folder: Path,
                 every: float) -> list[Sample]:
    """A sample every `every` seconds while the writer runs."""
    samples: list[Sample] = []
    began = time.monotonic()
    while writer.is_alive() and alive(runner, folder):
        samples.append(sample(runner.pid, time.monotonic() - began))
        time.sleep(max(0.0, began + len(samples) * every - time.monotonic()))  # the interval
    return samples


def pipeline_progress(folder: Path, catalog: Catalog, runner: subprocess.Popen[bytes]
                      ) -> dict[str, Any]:
    """Changes committed and processed when the writer stopped, and the catch-up after it."""
    committed = logged_changes(folder / "shop.db")
    status = catalog.status("latency")
    progress = {"written": committed - 1, "processed": int(status.get("rows_processed") or 0),
                "lag_seconds": status.get("lag_seconds"), "catch_up": None}
    began = time.monotonic()
    try:
        wait_until(lambda: alive(runner, folder) and int(
            catalog.status("latency").get("rows_processed") or 0) >= committed,
            CATCH_UP_SECONDS, "the pipeline to process every committed change")
        progress["catch_up"] = time.monotonic() - began
    except TimeoutError:
        pass
    return progress


def stop(runner: subprocess.Popen[bytes], writer: Any) -> None:
    if writer.is_alive():
        writer.terminate()
    if writer.pid is not None:
        writer.join(30)
    if runner.poll() is None:
        os.killpg(runner.pid, signal.SIGINT)
    try:
        runner.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(runner.pid, signal.SIGKILL)
        runner.wait(30)


def measure(folder: Path, args: argparse.Namespace) -> None:
    catalog = prepare(folder)
    runner = start_runner(folder)
    writer = multiprocessing.get_context("spawn").Process(
        target=write, args=(str(folder / "shop.db"), args.rate,
                            args.warmup_seconds + args.minutes * 60))
    try:
        wait_until(lambda: alive(runner, folder) and
                   catalog.get("latency").state.value == "RUNNING", 300, "RUNNING")
        first_batch_visible(folder, catalog, runner)
        writer.start()
        samples = sample_while(writer, runner, folder, args.sample_seconds)
        progress = pipeline_progress(folder, catalog, runner)
    finally:
        stop(runner, writer)
    report(samples, progress, args)


def report(samples: list[Sample], progress: dict[str, Any], args: argparse.Namespace) -> None:
    window = [s for s in samples if s.seconds >= args.warmup_seconds]
    if len(window) < 3:
        raise RuntimeError(f"only {len(window)} samples after warm-up: run for longer")
    print(f"RSS of `cdcflow run`'s process tree, embedded source at {args.rate:,.0f} changes/s, "
          f"{args.minutes:g} min after a {args.warmup_seconds:g} s warm-up, a sample every "
          f"{args.sample_seconds:g} s ({len(window)} samples in the window)")
    half = window[len(window) // 2:]
    for part in PARTS:
        values = [s.mib[part] for s in window]
        start, end = statistics.median(values[:3]), statistics.median(values[-3:])
        slope = slope_per_10_minutes([(s.seconds, s.mib[part]) for s in half])
        print(f"  {part:<8}: start {start:8,.1f} MiB, end {end:8,.1f} MiB, peak "
              f"{max(values):8,.1f} MiB, end/start {end / max(start, 1e-9):.3f}, "
              f"second-half slope {slope:+7.1f} MiB/10 min")
    print(f"  aim: end/start <= {AIM_RATIO:.2f} and second-half slope near 0")
    print(f"  processes (driver/jvm/workers) at start {process_counts(window[0])}, "
          f"at end {process_counts(window[-1])}")
    print_timeline(samples, args.warmup_seconds)
    print_progress(progress, args)


def process_counts(found: Sample) -> str:
    return "/".join(str(found.processes[p]) for p in PARTS[1:])


def print_timeline(samples: list[Sample], warmup: float) -> None:
    print("  timeline (minutes after the first batch: total / driver / jvm / workers MiB):")
    step = max(1, len(samples) // 12)
    for found in [*samples[::step][:-1], samples[-1]]:
        mark = " (warm-up)" if found.seconds < warmup else ""
        print(f"    {found.seconds / 60:5.1f}: " +
              " / ".join(f"{found.mib[p]:7,.1f}" for p in PARTS) + mark)


def print_progress(progress: dict[str, Any], args: argparse.Namespace) -> None:
    seconds = args.warmup_seconds + args.minutes * 60
    lag = progress["lag_seconds"]
    print(f"  writer committed {progress['written']:,} changes in {seconds:g} s "
          f"({progress['written'] / seconds:,.0f}/s); when it stopped the pipeline had "
          f"processed {progress['processed']:,} (all changes, with the seed row), "
          f"{progress['written'] + 1 - progress['processed']:,} behind, stream lag "
          f"{'n/a' if lag is None else f'{lag:.2f} s'}")
    caught = progress["catch_up"]
    print("  the pipeline processed every committed change " +
          (f"{caught:.1f} s after the writer stopped" if caught is not None
           else f"NOT within {CATCH_UP_SECONDS} s after the writer stopped"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--rate", type=float, default=1000)
    parser.add_argument("--sample-seconds", type=float, default=10)
    parser.add_argument("--warmup-seconds", type=float, default=60)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up as on Ctrl-C
    with tempfile.TemporaryDirectory() as folder:
        measure(Path(folder), args)


if __name__ == "__main__":
    main()
