"""Backfill rows/s of a 5,000,000-row MariaDB table, against two baselines measured in the same
run (issue 12):
  - `mariadb-dump --single-transaction` of the table into /dev/null (the named baseline);
  - a PyMySQL streaming `SELECT *` of the table (unbuffered cursor), into a counting sink:
    what a Python client pays for the rows before cdcflow does anything with them.
The table is pgbench_accounts' shape (aid INT key, bid, abalance, an 84-byte filler), filled
from MariaDB's sequence engine with the binlog off, in a buffer pool that holds it.
cdcflow is measured twice: reading the snapshot alone (`MySqlSource.snapshot` + `backfill`,
chunks into a counting sink), and the whole backfill of a stream into the table's CDC table
(`run_backfill`, what `cdcflow run` does before CDC).
Usage: python bench/bench_mysql_backfill.py [--rows 5000000] [--chunk-rows 5000]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pymysql.cursors

from cdcflow.capture.source import SourceObject
from cdcflow.clock import SYSTEM_CLOCK
from cdcflow.localmaria import LocalMariaDB
from cdcflow.streams.backfill import run_backfill
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.setup import prepare_stream
from mariakit import DATABASE, PASSWORD_ENV, capture_source, client_env, start_server

TABLE = "accounts"
SETTINGS: dict[str, str | None] = {"innodb-buffer-pool-size": "1G"}
FILL_STEP = 500_000


class CountingSink:
    def __init__(self) -> None:
        self.rows = 0

    def __call__(self, item: SourceObject, rows: list[dict[str, Any]], after: Any) -> None:
        self.rows += len(rows)


def timed(action: Callable[[], int]) -> tuple[int, float]:
    began = time.perf_counter()
    rows = action()
    return rows, time.perf_counter() - began


def fill(server: LocalMariaDB, rows: int) -> float:
    """The table with `rows` rows (not in the binlog); the seconds it took."""
    began = time.perf_counter()
    server.sql(f"CREATE TABLE {TABLE} (aid INT NOT NULL PRIMARY KEY, bid INT NOT NULL, "
               "abalance INT NOT NULL, filler CHAR(84))", database=DATABASE)
    for first in range(1, rows + 1, FILL_STEP):
        last = min(first + FILL_STEP - 1, rows)
        server.sql("SET sql_log_bin = 0",
                   f"INSERT INTO {TABLE} SELECT seq, (seq - 1) DIV 100000 + 1, 0, "
                   f"LPAD(seq, 84, '-') FROM seq_{first}_to_{last}", database=DATABASE)
    server.sql(f"ANALYZE TABLE {TABLE}", database=DATABASE)
    return time.perf_counter() - began


def dump(server: LocalMariaDB, rows: int) -> int:
    """mariadb-dump of the table into /dev/null; the password through MYSQL_PWD."""
    result = subprocess.run(
        ["mariadb-dump", "--single-transaction", "-h", "127.0.0.1", "-P", str(server.port),
         "-u", "cdc", DATABASE, TABLE], env=client_env(), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"mariadb-dump failed: {result.stderr[-2000:]}")
    return rows


def streaming_select(server: LocalMariaDB) -> int:
    conn = server.connect(database=DATABASE)
    count = 0
    try:
        with conn.cursor(pymysql.cursors.SSCursor) as cursor:
            cursor.execute(f"SELECT * FROM {TABLE}")
            while batch := cursor.fetchmany(10_000):
                count += len(batch)
    finally:
        conn.close()
    return count


def snapshot_read(server: LocalMariaDB, folder: Path, chunk_rows: int) -> int:
    source = capture_source(server, folder, (f"{DATABASE}.{TABLE}",), chunk_rows=chunk_rows)
    objects = [o for o in source.discover() if o.name == f"{DATABASE}.{TABLE}"]
    snapshot = source.snapshot(objects, None)
    sink = CountingSink()
    source.backfill(snapshot, objects, sink)
    source.release(snapshot)
    source.close()
    return sink.rows


def stream_backfill(server: LocalMariaDB, folder: Path, chunk_rows: int) -> int:
    catalog = Catalog(folder / "catalog.db")
    definition = StreamDefinition.parse({
        "name": "backfill", "include": [f"{DATABASE}.{TABLE}"], "backfill": "all",
        "source": {"kind": "mysql", "host": "127.0.0.1", "port": server.port, "user": "cdc",
                   "password_env": PASSWORD_ENV, "databases": [DATABASE],
                   "chunk_rows": chunk_rows},
        "destinations": [{"kind": "cdc_table", "warehouse": str(folder / "warehouse")}]})
    catalog.create(definition)
    setup = prepare_stream(definition, folder)
    run_backfill(setup, catalog, SYSTEM_CLOCK)
    setup.source.close()
    return int(catalog.status("backfill")["backfill"][f"{DATABASE}.{TABLE}"]["rows"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--chunk-rows", type=int, default=5000)
    args = parser.parse_args()
    server = start_server(SETTINGS)
    try:
        filled = fill(server, args.rows)
        with tempfile.TemporaryDirectory() as folder:
            results = {
                "mariadb-dump (baseline)": timed(lambda: dump(server, args.rows)),
                "PyMySQL streaming SELECT": timed(lambda: streaming_select(server)),
                "cdcflow snapshot read": timed(lambda: snapshot_read(
                    server, Path(folder) / "read", args.chunk_rows)),
                "cdcflow backfill -> CDC table": timed(lambda: stream_backfill(
                    server, Path(folder) / "stream", args.chunk_rows)),
            }
    finally:
        server.stop()
    report(results, args, filled)


def report(results: dict[str, tuple[int, float]], args: argparse.Namespace,
           filled: float) -> None:
    rates = {name: rows / seconds for name, (rows, seconds) in results.items()}
    dumped = rates["mariadb-dump (baseline)"]
    print(f"backfill of {DATABASE}.{TABLE}, {args.rows:,} rows (filled in {filled:.0f} s), "
          f"chunks of {args.chunk_rows} rows")
    for name, (rows, seconds) in results.items():
        print(f"  {name:30}: {rates[name]:>10,.0f} rows/s ({rows:,} rows, {seconds:.1f} s)"
              f"   ratio to mariadb-dump {rates[name] / dumped:.2f}")
    for name, (rows, _) in results.items():
        if rows != args.rows:
            print(f"  WARNING: {name} read {rows:,} rows, not {args.rows:,}")


if __name__ == "__main__":
    main()
