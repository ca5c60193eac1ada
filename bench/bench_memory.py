"""Memory of `cdcflow run` over a long run (issue 11, goal 6: RSS stays flat over 30 minutes).

The stream of bench_latency (embedded source, a CDC table and JSON event files, trigger
0.01 s) runs while a writer commits --rate changes/s for --minutes. Every --sample seconds the
resident memory of the runner's process tree is read from /proc: the runner (the Python
driver), the Spark JVM, and the Python workers. Sampling starts after the first batch. The
baseline is the start figure (median of the first three samples) measured in the same run;
printed: start, end (median of the last three), peak, end/start, and the slope of a
least-squares line over the second half in MiB per 10 minutes. Aim: end/start <= 1.10 and a
second-half slope near 0.
Usage: python bench/bench_memory.py [--minutes 30] [--rate 1000] [--sample 10]
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
from pathlib import Path

from bench_latency import prepare, write
from pgkit import wait_until

PARTS = ("driver", "jvm", "workers", "total")


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo += children(current)
    return out


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def sample(runner: int) -> dict[str, float]:
    parts = dict.fromkeys(PARTS, 0.0)
    for pid in tree(runner):
        part = "driver" if pid == runner else "jvm" if "java" in command(pid) else "workers"
        parts[part] += rss_mib(pid)
    parts["total"] = sum(parts[p] for p in PARTS[:3])
    return parts


def slope_per_10_minutes(points: list[tuple[float, float]]) -> float:
    if len(points) < 2:
        return 0.0
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        return 0.0
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread * 600


def report(samples: list[tuple[float, dict[str, float]]], args: argparse.Namespace,
           behind: int) -> None:
    print(f"RSS of `cdcflow run`, embedded source at {args.rate:,.0f} changes/s for "
          f"{args.minutes} min, a sample every {args.sample} s ({len(samples)} samples)")
    half = samples[len(samples) // 2:]
    for part in PARTS:
        values = [s[part] for _, s in samples]
        start, end = statistics.median(values[:3]), statistics.median(values[-3:])
        slope = slope_per_10_minutes([(t, s[part]) for t, s in half])
        print(f"  {part:<8}: start {start:8,.1f} MiB, end {end:8,.1f} MiB, peak "
              f"{max(values):8,.1f} MiB, end/start {end / max(start, 1e-9):.3f}, second-half "
              f"slope {slope:+7.1f} MiB/10 min")
    print(f"  aim: end/start <= 1.10 and second-half slope near 0; the pipeline was {behind:,} "
          "changes behind the writer at the end")


def measure(folder: Path, args: argparse.Namespace) -> None:
    catalog = prepare(folder)
    runner = subprocess.Popen(
        [sys.executable, "-m", "cdcflow.cli.main", "run", "--catalog",
         str(folder / "catalog.db"), "--master", "local[2]"], start_new_session=True,
        stdout=open(folder / "runner.log", "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    writer = multiprocessing.get_context("spawn").Process(
        target=write, args=(str(folder / "shop.db"), args.rate, args.minutes * 60))
    samples: list[tuple[float, dict[str, float]]] = []
    try:
        wait_until(lambda: catalog.get("latency").state.value == "RUNNING", 300, "RUNNING")
        writer.start()
        wait_until(lambda: catalog.status("latency").get("rows_processed"), 300,
                   "the first batch")
        began = time.monotonic()
        while writer.is_alive():
            samples.append((time.monotonic() - began, sample(runner.pid)))
            time.sleep(args.sample)  # the sampling interval, not a wait for another process
        written = int(args.rate * args.minutes * 60)
        behind = max(0, written - int(catalog.status("latency").get("rows_processed") or 0))
    finally:
        if writer.is_alive():
            writer.terminate()
        os.killpg(runner.pid, signal.SIGINT)
        runner.wait(120)
    report(samples, args, behind)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--rate", type=float, default=1000)
    parser.add_argument("--sample", type=float, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        measure(Path(folder), args)


if __name__ == "__main__":
    main()
