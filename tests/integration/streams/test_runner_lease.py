"""Two `cdcflow run` processes on one catalog (issue 14, concurrency): only the lease holder
drives the stream while both live; when it is SIGKILLed (with its JVM), the other takes the
stream over once the lease expires, and `cdcflow verify` finds the CDC table and the events
equal to the source, no event written twice. The standby warms up while it waits."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cdcflow import Database
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.testing import WORKLOAD_DDL, run_writer
from tests.integration.streams.test_verify import cli_verify

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "cdcflow.cli.main", "run", "--master", "local[1]", "--json",
       "--lease-seconds", "5"]


def start_runner(catalog_path: str, said: Path) -> subprocess.Popen[bytes]:
    """`cdcflow run`, its stderr (what it says of the lease and its warm-up) into `said`."""
    with said.open("wb") as err:
        return subprocess.Popen([*CLI, "--catalog", catalog_path], start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=err)


def holder_pid(catalog: Catalog) -> int | None:
    lease = catalog.lease()
    return None if lease is None else int(lease[0].split(":")[1])


def test_a_second_runner_waits_then_takes_over_a_killed_one(tmp_path: Path):
    path = str(tmp_path / "shop.db")
    db = Database.open(path)
    db.ddl(WORKLOAD_DDL)
    db.ddl("CREATE CHANGE STREAM Everything FOR ALL")
    catalog_path = str(tmp_path / "catalog.db")
    catalog = Catalog(catalog_path)
    catalog.create(StreamDefinition.parse({
        "name": "s", "source": {"database": path, "change_stream": "Everything"},
        "include": ["Accounts"],
        "destinations": [{"kind": "cdc_table", "warehouse": str(tmp_path / "w")},
                         {"kind": "event_files", "root": str(tmp_path / "events")}],
        "spark": {"trigger_seconds": 0.3, "max_records_per_trigger": 40}}))
    catalog.act("s", "start")
    runners = [start_runner(catalog_path, tmp_path / f"runner-{n}.err") for n in (0, 1)]
    writer = multiprocessing.get_context("spawn").Process(
        target=run_writer, args=(path, 3, 500, str(tmp_path / "history.jsonl"), 200, 0.02))
    try:
        deadline = time.monotonic() + 240
        while catalog.get("s").state.value != "RUNNING":
            assert all(r.poll() is None for r in runners) and time.monotonic() < deadline, \
                catalog.errors("s")
            time.sleep(0.1)
        writer.start()
        leader = holder_pid(catalog)
        [standby] = [r for r in runners if r.pid != leader]
        while (catalog.status("s").get("batches") or 0) < 5:  # both alive: one drives
            assert holder_pid(catalog) == leader and standby.poll() is None
            assert time.monotonic() < deadline, catalog.errors("s")
            time.sleep(0.1)
        said = (tmp_path / f"runner-{runners.index(standby)}.err").read_text()
        while "standby: warmed up in" not in said:  # a takeover starts warm
            assert "warm-up failed" not in said and time.monotonic() < deadline, said
            time.sleep(0.1)
            said = (tmp_path / f"runner-{runners.index(standby)}.err").read_text()
        before = catalog.status("s")["batches"]
        os.killpg(leader, signal.SIGKILL)
        while holder_pid(catalog) != standby.pid or \
                (catalog.status("s").get("batches") or 0) < before + 3:
            assert standby.poll() is None and time.monotonic() < deadline + 120, \
                catalog.errors("s")
            time.sleep(0.1)
        writer.join(timeout=300)
        assert writer.exitcode == 0
        code, report = cli_verify(Path(catalog_path), "s")  # drains through the new leader
        assert code == 0 and report["how"] == "drained by verify", report
        [accounts] = report["objects"]
        assert accounts["events"]["duplicate_uuids"] == 0 and accounts["rows"]["source"] > 0
    finally:
        for runner in runners:
            if runner.poll() is None:
                os.killpg(runner.pid, signal.SIGINT)
                runner.wait(timeout=120)
    db.close()
