"""Streams on a Spark standalone cluster (issue 15), on this machine's 2 cores.

Throughput: a log of --changes upserts (100-row transactions) is filled once. For 1 and then 2
workers of 1 core each, a fresh cluster runs `apply_change_stream` over the whole log with
trigger availableNow and --per-batch changes per batch (more than the driver's small-batch
limit, so every batch goes to the executors), with its log segments, tables and checkpoint
on the storage root.

Spark's `--cores 1` is one task slot, not one CPU: an unbound worker's executor spreads its
JVM threads and Python worker over both CPUs of this machine, so "1 worker" already uses more
than one core and 2 workers have little left to gain. The workers are therefore bound to a CPU
each (`taskset`, as a machine of one CPU would be), and the same pair runs unbound too with
--unbound. The driver is never bound: it shares the CPUs with the workers, which costs the
2-worker run more than the 1-worker one.

The figures are changes/s over the batches after the first --warm-up-batches (during which
each executor's JVM compiles Spark's code paths and its Python workers start: about 7 s of
C2 compiling per executor JVM, measured per process) from Spark's batch durations, and
changes / the query's whole wall time; the ratio printed is 2 workers / 1 worker (the issue's
goal: >= 1.6).

Latency: `cdcflow run` with the stream's definition on the cluster (2 workers; the master
and storage root come from the definition) and then on local[2], the baseline, in the same
run. A writer commits --rate changes/s for --seconds; a probe row every --every s; p50 and p99
from commit to the CDC table and to a committed event file (`bench_latency.Probes`); the
ratio printed is cluster / local.

Usage: python bench/bench_cluster.py [--changes 1050000] [--per-batch 50000]
       [--warm-up-batches 5] [--unbound] [--rate 1000] [--seconds 30] [--skip-latency]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_latency import percentiles, prepare, run_probes
from cdcflow.localcluster import standalone_cluster
from cdcflow.store.database import Database

TABLES = ["CREATE TABLE Accounts (Id INT64 NOT NULL, Owner STRING(MAX), Balance INT64) "
          "PRIMARY KEY (Id)", "CREATE TABLE Probe (Id INT64 NOT NULL) PRIMARY KEY (Id)"]


def fill(path: str, changes: int) -> None:
    database = Database.open(path)
    database.ddl(TABLES)
    database.ddl("CREATE CHANGE STREAM Everything FOR ALL")
    for start in range(0, changes, 100):
        with database.transaction() as tx:
            for key in range(start, min(start + 100, changes)):
                tx.insert_or_update("Accounts", {"Id": key % 50_000, "Owner": f"o{key % 7}",
                                                 "Balance": key})


def child_throughput(master: str, database: str, root: str, per_batch: int,
                     warm_up: int) -> None:
    """In a process of its own: one query over the whole log; prints its JSON figures."""
    from cdcflow.spark import apply_change_stream, session

    spark = session("bench-cluster", master=master)
    rows: dict[int, int] = {}  # Spark counts no input row where tasks read the log themselves
    began = time.monotonic()
    query = apply_change_stream(spark, database, "Everything", Path(root) / "warehouse",
                                Path(root) / "checkpoint", trigger={"availableNow": True},
                                max_records_per_trigger=per_batch,
                                segment_root=str(Path(root) / "segments"),
                                on_batch=lambda done: rows.update({done["batch_id"]:
                                                                   done["rows"]}))
    query.awaitTermination()
    seconds = time.monotonic() - began
    batches = [(rows[p["batchId"]], p["durationMs"]["triggerExecution"] / 1000)
               for p in query.recentProgress if rows.get(p["batchId"])]
    later = batches[warm_up:]
    print(json.dumps({"seconds": seconds, "batches": len(batches),
                      "steady_rows": sum(r for r, _ in later),
                      "steady_seconds": sum(s for _, s in later)}))
    spark.stop()


def throughput(folder: Path, workers: int, bound: bool,
               args: argparse.Namespace) -> dict[str, float]:
    name = f"{workers}-{'bound' if bound else 'unbound'}"
    with standalone_cluster(folder / f"cluster-{name}", workers, pinned=bound) as cluster:
        done = subprocess.run(
            [sys.executable, __file__, "--child", cluster.url, str(folder / "filled.db"),
             str(folder / f"run-{name}"), str(args.per_batch), str(args.warm_up_batches)],
            capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the query on {workers} worker(s) failed: {done.stderr[-3000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    figures["rate"] = args.changes / figures["seconds"]
    figures["steady"] = figures["steady_rows"] / figures["steady_seconds"]
    return figures


def latency(folder: Path, spark: dict[str, object], command: list[str],
            args: argparse.Namespace) -> tuple[float, float, float, float]:
    """p50 and p99 of commit -> CDC table, and of commit -> event file, in seconds."""
    folder.mkdir()
    probes, _ = run_probes(folder, prepare(folder, spark), command, args)
    numbers = [n for n in probes.committed if n > 0]
    table = percentiles([probes.in_table[n] - probes.committed[n] for n in numbers])
    events = percentiles([probes.in_events[n] - probes.committed[n] for n in numbers])
    return (*table, *events)


def measure(folder: Path, args: argparse.Namespace) -> None:
    fill(str(folder / "filled.db"), args.changes)
    print(f"throughput, {args.changes:,} changes, {args.per_batch:,} per batch, every batch on "
          f"the executors, segments on the storage root; steady = after the first "
          f"{args.warm_up_batches} batches:")
    for bound in (True, False) if args.unbound else (True,):
        print("  workers bound to a CPU each:" if bound else "  workers unbound:")
        one, two = throughput(folder, 1, bound, args), throughput(folder, 2, bound, args)
        for label, figures in (("1 worker ", one), ("2 workers", two)):
            print(f"    {label}: {figures['steady']:9,.0f} changes/s steady "
                  f"({figures['steady_rows']:,} in {figures['steady_seconds']:.1f} s); "
                  f"{figures['rate']:,.0f}/s over the whole query ({figures['seconds']:.1f} s, "
                  f"{figures['batches']} batches)")
        print(f"    scaling 2 workers / 1 worker: {two['steady'] / one['steady']:.2f} steady, "
              f"{two['rate'] / one['rate']:.2f} whole (goal >= 1.6)")
    if args.skip_latency:
        return
    with standalone_cluster(folder / "cluster-latency", 2) as cluster:
        on_cluster = latency(folder / "latency-cluster", {
            "master": cluster.url, "storage_root": str(folder)}, [], args)
    local = latency(folder / "latency-local", {}, ["--master", "local[2]"], args)
    print(f"commit -> visible, {args.rate:,.0f} changes/s for {args.seconds:.0f} s, a probe "
          f"every {args.every} s, trigger 0.01 s:")
    for index, label in ((0, "CDC table  p50"), (1, "CDC table  p99"), (2, "event file p50"),
                         (3, "event file p99")):
        print(f"  {label}: cluster {on_cluster[index] * 1000:7,.0f} ms, local[2] "
              f"{local[index] * 1000:7,.0f} ms, ratio {on_cluster[index] / local[index]:.2f}")


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        master, database, root, per_batch, warm_up = sys.argv[2:7]
        child_throughput(master, database, root, int(per_batch), int(warm_up))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--changes", type=int, default=1_050_000)
    parser.add_argument("--per-batch", type=int, default=50_000)
    parser.add_argument("--rate", type=float, default=1000)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--every", type=float, default=0.2)
    parser.add_argument("--warm-up-batches", type=int, default=5)
    parser.add_argument("--unbound", action="store_true",
                        help="measure the pair with unbound workers too")
    parser.add_argument("--skip-latency", action="store_true")
    args = parser.parse_args()
    if args.changes <= (args.warm_up_batches + 1) * args.per_batch:
        parser.error(f"--changes {args.changes} leaves no batch after the "
                     f"{args.warm_up_batches} warm-up batches of {args.per_batch}")
    with tempfile.TemporaryDirectory() as folder:
        measure(Path(folder), args)


if __name__ == "__main__":
    main()
