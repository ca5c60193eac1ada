"""`cdcflow demo` (the main job) and `cdcflow run` as a user runs them: real processes."""

from __future__ import annotations

import json
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

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "cdcflow.cli.main"]


def test_demo_runs_and_verifies(tmp_path: Path):
    result = subprocess.run([*CLI, "demo", "--duration", "20", "--output", str(tmp_path / "d"),
                             "--master", "local[2]"], capture_output=True, text=True,
                            timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "verification passed" in result.stdout
    summary = json.loads(result.stdout[result.stdout.index("{\n"):
                                       result.stdout.index("\n}") + 2])
    assert summary["changes"] > 100
    assert all(check["equal"] for check in summary["verification"].values())
    assert list((tmp_path / "d" / "events" / "demo").rglob("*.jsonl"))
    assert set(summary["tables"]) == {"Singers", "AccountBalance"}
    assert all(t["apply_watermark"] and t["pending_rows"] == 0
               for t in summary["tables"].values())
    assert summary["errors"] == []
    assert result.stderr == ""  # Spark's own output goes to spark.log unless --verbose
    spark_log = (tmp_path / "d" / "spark.log").read_text()
    for failure in ("Exception in thread", "StackOverflowError"):
        assert failure not in spark_log, spark_log[-3000:]


def test_run_resumes_a_running_stream_and_stops_cleanly_on_interrupt(tmp_path: Path):
    path = str(tmp_path / "shop.db")
    db = Database.open(path)
    db.ddl("CREATE TABLE T (Id INT64 NOT NULL, V INT64) PRIMARY KEY (Id)")
    db.ddl("CREATE CHANGE STREAM Everything FOR ALL")
    catalog = Catalog(tmp_path / "catalog.db")
    catalog.create(StreamDefinition.parse({
        "name": "s", "source": {"database": path, "change_stream": "Everything"},
        "destinations": [{"kind": "cdc_table", "warehouse": str(tmp_path / "w")}],
        "spark": {"trigger_seconds": 0.5}}))
    catalog.act("s", "start")
    key = 0
    for _ in range(2):  # the second run resumes the RUNNING stream from its checkpoint
        process = subprocess.Popen([*CLI, "run", "--catalog", str(tmp_path / "catalog.db"),
                                    "--master", "local[2]"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        before = catalog.status("s").get("rows_processed") or 0
        deadline = time.monotonic() + 180
        while (catalog.status("s").get("rows_processed") or 0) <= before:
            assert process.poll() is None, process.communicate()[1][-2000:]
            assert time.monotonic() < deadline, catalog.errors("s")
            with db.transaction() as tx:  # keep changes coming until the stream moves
                tx.insert("T", {"Id": key, "V": key})
            key += 1
            time.sleep(1.0)
        os.kill(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err[-2000:]
        assert "stream states saved" in out
        assert err == ""  # Spark's own output goes to logs/spark.log unless --verbose
        assert "Exception in thread" not in (tmp_path / "logs" / "spark.log").read_text()
        assert catalog.get("s").state.value == "RUNNING"
