"""Streams on a real standalone cluster (issue 15): 1 master and 2 workers of 1 core, each
worker in a mount namespace where the driver's working tree, the catalog, the SQLite logs and
the embedded database are hidden (an empty tmpfs over each). `cdcflow run` takes the master
from the definitions; its master check gets the cluster's version from the master's real REST
server. An embedded stream and a PostgreSQL stream, every batch sent to the executors
(`driver_batch_rows: 0`; the embedded one with partitions split and merged as it runs), end
equal to their sources (`cdcflow verify`) and to a `local[2]` run of the same changes, though
the runner is SIGKILLed with its JVM at a random moment of the writes and started again, as a
user would (the fault campaign's many kinds, on one machine, are issue 14's). A job on the
public API run by `spark-submit --master` reads the same changes on the executors as a local
read. A stream whose storage root is not shared (under the hidden folder, so the executors
see an empty tmpfs there) fails before its first batch, naming the root."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import psycopg2
import pytest
import yaml

from cdcflow import Database
from cdcflow.localcluster import standalone_cluster
from cdcflow.localdb import LocalPostgres
from cdcflow.spark.master import REST_PORT_VARIABLE, server_version
from cdcflow.store.changelog import open_log
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.states import StreamState
from cdcflow.table import CdcTable
from cdcflow.testing import WORKLOAD_DDL, run_mixed_writer, run_partition_churn
from tests.integration.postgres.test_postgres_stream import cli
from tests.integration.streams.test_runner import running, wait_for
from tests.integration.streams.test_verify import cli_verify

pytestmark = pytest.mark.integration
REPOSITORY = Path(__file__).resolve().parents[3]
PG_PASSWORD = "CDCFLOW_TEST_CLUSTER_PG_PASSWORD"


def definitions(folder: Path, root: Path, db_path: str, pg: LocalPostgres,
                spark: dict[str, Any], suffix: str = "") -> list[Path]:
    """The embedded and the PostgreSQL stream, into CDC tables and events under `root`."""
    out = []
    for name, source in (
            (f"lake{suffix}", {"database": db_path, "change_stream": "Everything"}),
            (f"pg{suffix}", {"kind": "postgres", "dsn": pg.dsn(), "heartbeat_seconds": 1,
                             "password_env": PG_PASSWORD})):
        path = folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump({
            "name": name, "backfill": "all", "source": source,
            "include": ["Accounts"] if not name.startswith("pg") else ["public.*"],
            "destinations": [{"kind": "cdc_table", "warehouse": str(root / name / "warehouse")},
                             {"kind": "event_files", "root": str(root / name / "events"),
                              "format": "avro"}],
            "spark": spark}))
        out.append(path)
    return out


def pg_writes(pg: LocalPostgres, seed: int, rounds: int, create: bool = False) -> None:
    conn = psycopg2.connect(pg.dsn(), password=pg.password)
    conn.autocommit = True
    with conn.cursor() as cursor:
        if create:
            cursor.execute("CREATE TABLE orders (id int PRIMARY KEY, note text, qty int)")
        for i in range(rounds):
            key = seed * 1000 + i
            cursor.execute("INSERT INTO orders VALUES (%s, %s, %s)", (key, f"n{key}", i))
            cursor.execute("UPDATE orders SET qty = qty + 1 WHERE id %% 7 = %s", (i % 7,))
            if i % 5 == 0:
                cursor.execute("DELETE FROM orders WHERE id = %s", (key - 3,))
    conn.close()


def rows_of(root: Path) -> list[dict[str, Any]]:
    table = CdcTable.open(root)
    return sorted(table.to_arrow().to_pylist(), key=lambda r: tuple(map(str, r.values())))


def check_a_submitted_job(spark: Any, master: str, db_path: str, ending: str,
                          segments: Path) -> None:
    """`spark-submit --master` runs a job on the public API on the cluster: the same mods
    per table as a local read of the same range, and the same table snapshot."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "spark-submit"), "--master", master,
         str(Path(__file__).parent / "submitted_job.py"), db_path, "Everything",
         str(segments), ending], capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr[-3000:]
    submitted = json.loads(done.stdout.strip().splitlines()[-1])
    local = (spark.read.format("cdcflow").option("database", db_path)
             .option("stream", "Everything").option("startingTimestamp", "earliest")
             .option("endingTimestamp", ending).load().groupBy("table_name").count().collect())
    assert submitted["master"] == master
    assert submitted["counts"] == {r["table_name"]: r["count"] for r in local}
    assert submitted["counts"]["Accounts"] > 0
    assert [p for p in segments.rglob("*.arrow") if not p.name.endswith(".snapshot.arrow")]
    snapshot = (spark.read.format("cdcflow").option("database", db_path)
                .option("table", "Accounts").option("readTimestamp", ending).load().collect())
    assert submitted["accounts"] == sorted(json.dumps(row.asDict(), sort_keys=True)
                                          for row in snapshot)
    assert submitted["accounts"] and list(segments.rglob("*.snapshot.arrow"))


def wait_running(catalog: Catalog, names: list[str], runner: subprocess.Popen[bytes],
                 seconds: float = 400) -> None:
    deadline = time.monotonic() + seconds
    while any(catalog.get(n).state != StreamState.RUNNING for n in names):
        states = {n: (catalog.get(n).state, catalog.errors(n)) for n in names}
        assert runner.poll() is None, f"the runner ended: {states}"
        assert time.monotonic() < deadline, f"not running: {states}"
        assert not any(s == StreamState.FAILED_PERMANENTLY for s, _ in states.values()), states
        time.sleep(0.5)


def start_runner(catalog_path: Path, rest_port: int, log: Path) -> subprocess.Popen[bytes]:
    """`cdcflow run` as a user starts it, the master taken from the definitions; a group of
    its own, so that a SIGKILL takes its JVM and capture workers too."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "cdcflow.cli.main", "run", "--catalog", str(catalog_path),
             "--json", "--lease-seconds", "3"], stdout=out, stderr=subprocess.STDOUT,
            cwd=catalog_path.parent, start_new_session=True,
            env={**os.environ, REST_PORT_VARIABLE: str(rest_port)})


def create_streams(catalog_path: Path, definitions: list[Path]) -> None:
    for path in definitions:
        cli(catalog_path, "create", str(path))
        cli(catalog_path, "start", path.stem)


def check_unshared_root_refused(catalog: Catalog, root: Path) -> None:
    """The runner may reach this stream after the others run: wait for its verdict."""
    deadline = time.monotonic() + 180
    while (stream := catalog.get("lake-unshared")).state != StreamState.FAILED_PERMANENTLY:
        assert stream.state != StreamState.RUNNING, stream  # FAILED comes first, briefly
        assert time.monotonic() < deadline, f"never refused: {stream}"
        time.sleep(0.5)
    [error] = catalog.errors("lake-unshared")
    assert f"storage root '{root}' is not one folder shared by the driver and every executor " \
           f"({socket.gethostname()}: can't read the driver's probe file" in error["message"]
    assert not (root / "lake-unshared").exists()


def write_with_churn_and_a_kill(db_path: str, pg: LocalPostgres,
                                runner: subprocess.Popen[bytes]) -> None:
    """The writers, partitions split and merged meanwhile, and the runner SIGKILLed with its
    JVM at a random moment of it."""
    churn = multiprocessing.get_context("spawn").Process(
        target=run_partition_churn, args=(db_path, "Everything", 4.0, 5))
    churn.start()
    moment = random.uniform(0.5, 4.0)
    killer = threading.Timer(moment, os.killpg, (runner.pid, signal.SIGKILL))
    killer.start()
    run_mixed_writer(db_path, 3, 300)
    pg_writes(pg, 2, 150)
    killer.join()
    assert runner.wait(60) == -signal.SIGKILL, f"killed {moment:.2f} s in"
    churn.join(60)
    assert churn.exitcode == 0
    assert len(open_log(db_path).partitions("Everything")) > 1


def check_equal_to_sources(catalog: Catalog, catalog_path: Path, shared: Path,
                           runner_out: Path) -> None:
    for name in ("lake", "pg"):
        code, report = cli_verify(catalog_path, name)
        # A text, not a tuple: pytest shortens the repr of anything else, and the stream's
        # errors are what a failure here needs shown whole; the newest first of all, since
        # a long output is shown with its middle cut out.
        errors = catalog.errors(name)
        assert code == 0 and report["equal"], (
            f"stream {name}'s newest error: {errors[0]['message'] if errors else None}\n"
            f"its errors, newest first: {json.dumps(errors, indent=1)}"
            f"\nverify: {json.dumps(report)}\nthe runner's output, its end:\n"
            f"{runner_out.read_text()[-4000:]}")
        assert all(o["rows"]["source"] > 0 for o in report["objects"]), report
        [folder] = (shared / "segments").glob(f"{name}-*")  # no batch went to executors?
        segments = list(folder.rglob("*.arrow"))
        assert len(segments) <= 12, f"segments of committed batches: {segments}"
        said = catalog.status(name)["segments"]
        assert said["root"] == str(folder) and said["files"] <= 12, said


def test_streams_on_a_cluster_equal_the_source_and_a_local_run(spark, tmp_path: Path,
                                                               monkeypatch: Any):
    private, shared = tmp_path / "private", tmp_path / "shared"
    private.mkdir()
    pg = LocalPostgres.start()
    os.environ[PG_PASSWORD] = pg.password
    try:
        db_path = str(private / "shop.db")
        db = Database.open(db_path)
        db.ddl(WORKLOAD_DDL)
        db.ddl("CREATE CHANGE STREAM Everything FOR ALL")
        run_mixed_writer(db_path, 7, 100)  # rows only the backfill delivers
        pg_writes(pg, 1, 50, create=True)
        with standalone_cluster(tmp_path / "cluster", 2, hidden=[private, REPOSITORY]) as c:
            settings = {"master": c.url, "storage_root": str(shared), "trigger_seconds": 0.5,
                        "driver_batch_rows": 0}
            catalog_path = private / "catalog.db"
            unshared = {**settings, "storage_root": str(private / "store")}
            create_streams(catalog_path, [
                *definitions(private, shared, db_path, pg, settings),
                definitions(private, private / "store", db_path, pg, unshared, "-unshared")[0]])
            monkeypatch.setenv(REST_PORT_VARIABLE, str(c.rest_port))
            assert server_version("127.0.0.1", 5.0) == version("pyspark")  # what run checks
            catalog = Catalog(catalog_path)
            runner = start_runner(catalog_path, c.rest_port, private / "runner.out")
            try:
                wait_running(catalog, ["lake", "pg"], runner)
                check_unshared_root_refused(catalog, private / "store")
                write_with_churn_and_a_kill(db_path, pg, runner)
                runner = start_runner(catalog_path, c.rest_port, private / "runner.out")
                check_equal_to_sources(catalog, catalog_path, shared, private / "runner.out")
            finally:
                os.killpg(runner.pid, signal.SIGINT)
                assert runner.wait(120) == 0, (private / "runner.out").read_text()[-3000:]
            check_a_submitted_job(spark, c.url, db_path, db.current_timestamp().isoformat(),
                                  shared / "submitted")
        check_a_local_run(spark, tmp_path / "local", shared, db_path, pg)
        db.close()
    finally:
        pg.stop()


def check_a_local_run(spark: Any, local: Path, shared: Path, db_path: str,
                      pg: LocalPostgres) -> None:
    """The same changes through local[2] give the same CDC tables as the cluster."""
    local.mkdir()
    create_streams(local / "catalog.db", definitions(local, local, db_path, pg,
                                                     {"trigger_seconds": 0.3}, "-local"))
    with running(local / "catalog.db", spark):
        for name in ("lake-local", "pg-local"):
            wait_for(Catalog(local / "catalog.db"), name, StreamState.RUNNING)
            code, report = cli_verify(local / "catalog.db", name)
            assert code == 0 and report["equal"], report
    for cluster_table, local_table in (("lake/warehouse/Accounts",
                                        "lake-local/warehouse/Accounts"),
                                       ("pg/warehouse/public.orders",
                                        "pg-local/warehouse/public.orders")):
        assert rows_of(shared / cluster_table) == rows_of(local / local_table)
