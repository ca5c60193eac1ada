"""Backfill rows/s of pgbench_accounts at scale 50 (5,000,000 rows), against two baselines
measured in the same run (issue 10):
  - `COPY pgbench_accounts TO STDOUT`, through psycopg2 into a counting sink;
  - Spark's own JDBC read of the table (Debian's libpostgresql-jdbc-java, installed here if
    missing; this benchmark is its only user), two partitions on aid, into the noop sink.
cdcflow is measured twice: reading the snapshot alone (chunks into a counting sink), and the
whole backfill of a stream into the table's CDC table (what `cdcflow run` does before CDC).
Usage: python bench/bench_pg_backfill.py [--scale 50] [--chunk-rows 5000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg2

from cdcflow.capture.source import SourceObject
from cdcflow.clock import SYSTEM_CLOCK
from cdcflow.localdb import LocalPostgres
from cdcflow.streams.backfill import run_backfill
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.setup import prepare_stream
from pgkit import PASSWORD_ENV, capture_source, pgbench, start_server

JDBC_JAR = Path("/usr/share/java/postgresql.jar")


class CountingSink:
    def __init__(self) -> None:
        self.rows = 0

    def write(self, data: bytes) -> int:
        self.rows += data.count(b"\n")
        return len(data)

    def __call__(self, item: SourceObject, rows: list[dict[str, Any]], after: Any) -> None:
        self.rows += len(rows)


def timed(action: Callable[[], int]) -> tuple[int, float]:
    began = time.perf_counter()
    rows = action()
    return rows, time.perf_counter() - began


def copy_out(server: LocalPostgres) -> int:
    sink = CountingSink()
    with psycopg2.connect(server.dsn(), password=server.password) as conn, conn.cursor() as cur:
        cur.copy_expert("COPY public.pgbench_accounts TO STDOUT", sink)
    return sink.rows


def spark_jdbc(server: LocalPostgres, scale: int) -> tuple[int, float]:
    if not JDBC_JAR.exists():
        subprocess.run(["apt-get", "install", "-y", "-qq", "libpostgresql-jdbc-java"],
                       check=True, env=os.environ | {"DEBIAN_FRONTEND": "noninteractive"})
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("bench-jdbc")
             .config("spark.jars", str(JDBC_JAR)).config("spark.ui.enabled", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    frame = spark.read.jdbc(
        f"jdbc:postgresql://127.0.0.1:{server.port}/shop", "public.pgbench_accounts",
        column="aid", lowerBound=1, upperBound=scale * 100_000, numPartitions=2,
        properties={"user": "cdc", "password": server.password,
                    "driver": "org.postgresql.Driver", "fetchsize": "10000"})
    began = time.perf_counter()
    frame.write.format("noop").mode("overwrite").save()
    seconds = time.perf_counter() - began
    rows = frame.count()  # not timed: the session's start is not timed either
    spark.stop()
    return int(rows), seconds


def snapshot_read(server: LocalPostgres, folder: Path, chunk_rows: int) -> int:
    source = capture_source(server, folder, chunk_rows=chunk_rows)
    objects = [o for o in source.discover() if o.name == "public.pgbench_accounts"]
    snapshot = source.snapshot(objects, None)
    sink = CountingSink()
    source.backfill(snapshot, objects, sink)
    source.release(snapshot)
    source.drop_slot()
    source.close()
    return sink.rows


def stream_backfill(server: LocalPostgres, folder: Path, chunk_rows: int) -> int:
    catalog = Catalog(folder / "catalog.db")
    definition = StreamDefinition.parse({
        "name": "backfill", "include": ["public.pgbench_accounts"], "backfill": "all",
        "source": {"kind": "postgres", "dsn": server.dsn(), "password_env": PASSWORD_ENV,
                   "chunk_rows": chunk_rows},
        "destinations": [{"kind": "cdc_table", "warehouse": str(folder / "warehouse")}]})
    catalog.create(definition)
    setup = prepare_stream(definition, folder)
    run_backfill(setup, catalog, SYSTEM_CLOCK)
    setup.source.close()
    return int(catalog.status("backfill")["backfill"]["public.pgbench_accounts"]["rows"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=int, default=50)
    parser.add_argument("--chunk-rows", type=int, default=5000)
    args = parser.parse_args()
    server = start_server()
    try:
        pgbench(server, "-i", "-q", "-s", str(args.scale))
        server.sql("shop", "VACUUM ANALYZE public.pgbench_accounts")
        with tempfile.TemporaryDirectory() as folder:
            results = {
                "COPY TO STDOUT (baseline)": timed(lambda: copy_out(server)),
                "Spark JDBC read (baseline)": spark_jdbc(server, args.scale),
                "cdcflow snapshot read": timed(lambda: snapshot_read(
                    server, Path(folder) / "read", args.chunk_rows)),
                "cdcflow backfill -> CDC table": timed(lambda: stream_backfill(
                    server, Path(folder) / "stream", args.chunk_rows)),
            }
    finally:
        server.stop()
    rates = {name: rows / seconds for name, (rows, seconds) in results.items()}
    print(f"backfill of pgbench_accounts, scale {args.scale}, chunks of {args.chunk_rows} rows")
    for name, (rows, seconds) in results.items():
        print(f"  {name:32}: {rates[name]:>10,.0f} rows/s ({rows:,} rows, {seconds:.1f} s)")
    for mine in ("cdcflow snapshot read", "cdcflow backfill -> CDC table"):
        print(f"  {mine} / COPY: {rates[mine] / rates['COPY TO STDOUT (baseline)']:.2f}, "
              f"/ Spark JDBC: {rates[mine] / rates['Spark JDBC read (baseline)']:.2f}")


if __name__ == "__main__":
    main()
