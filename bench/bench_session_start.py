"""How long a Spark session and its first streaming query take to start, with the class
archive `cdcflow prepare` makes and without it (the baseline), in the same run (issue 14: a
killed runner is back as soon as its new JVM is).

Each start is a new process: `session()`, then a streaming query from the "cdcflow" source
of a small embedded database into Parquet, run to its end (availableNow). Reported: wall
seconds of each part, and the CPU seconds of the JVM and its Python workers.
  baseline       the JDK's own class sharing only (CDCFLOW_DRIVER_JAVA_OPTIONS=-Xshare:auto)
  archive        the archive of `cdcflow prepare` (made first if missing)
  archive + C1   also -XX:TieredStopAtLevel=1, as `make test` runs its sessions
Usage: python bench/bench_session_start.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from cdcflow.spark.class_archive import DRIVER_OPTIONS_VARIABLE

START = """
import json, os, subprocess, sys, tempfile, time
began = time.perf_counter()
from cdcflow import Database
from cdcflow.spark import session
folder = tempfile.mkdtemp()
db = Database.open(f"{folder}/db.sqlite")
db.ddl("CREATE TABLE T (Id INT64 NOT NULL, V INT64) PRIMARY KEY (Id)")
db.ddl("CREATE CHANGE STREAM S FOR ALL")
with db.transaction() as tx:
    for i in range(100):
        tx.insert_or_update("T", {"Id": i, "V": i})
spark = session("bench-start", master="local[2]")
started = time.perf_counter()
query = (spark.readStream.format("cdcflow").option("database", f"{folder}/db.sqlite")
         .option("stream", "S").option("startingTimestamp", "earliest").load()
         .writeStream.format("parquet").option("checkpointLocation", f"{folder}/checkpoint")
         .trigger(availableNow=True).start(f"{folder}/out"))
query.awaitTermination()
ran = time.perf_counter()
jvm = spark.sparkContext._gateway.proc.pid
tree = subprocess.run(["ps", "-o", "pid=", "--ppid", str(jvm)], capture_output=True,
                      text=True).stdout.split() + [str(jvm)]
ticks = 0
for pid in tree:
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        continue
    ticks += sum(int(f) for f in fields[11:15])
print(json.dumps({"session": started - began, "query": ran - started,
                  "cpu": ticks / os.sysconf("SC_CLK_TCK")}))
"""

CONFIGS = {"baseline": "-Xshare:auto", "archive": "", "archive + C1": "-XX:TieredStopAtLevel=1"}


def one_start(options: str) -> dict[str, float]:
    env = os.environ | {DRIVER_OPTIONS_VARIABLE: options}
    done = subprocess.run([sys.executable, "-c", START], env=env, capture_output=True,
                          text=True, timeout=600, check=True)
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    subprocess.run([str(Path(sys.executable).parent / "cdcflow"), "prepare"], check=True)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in CONFIGS}
    for _ in range(args.runs):  # interleaved, so a slower minute hits every config alike
        for name, options in CONFIGS.items():
            results[name].append(one_start(options))
    base = {key: statistics.median(r[key] for r in results["baseline"])
            for key in ("session", "query", "cpu")}
    print(f"session start + first streaming query, median of {args.runs} runs each")
    for name, runs in results.items():
        med = {key: statistics.median(r[key] for r in runs) for key in base}
        total, base_total = med["session"] + med["query"], base["session"] + base["query"]
        print(f"  {name:13}: session {med['session']:.1f} s, first query {med['query']:.1f} s, "
              f"wall {total:.1f} s ({total / base_total:.2f} of baseline), JVM CPU "
              f"{med['cpu']:.1f} s ({med['cpu'] / base['cpu']:.2f} of baseline)")


if __name__ == "__main__":
    main()
