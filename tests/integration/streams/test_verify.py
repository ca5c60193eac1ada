"""`cdcflow verify` (issue 14): a running embedded stream is drained, compared at the drain's
log time while a writer goes on, and resumed; a stream whose CDC table and events were
tampered with is reported with the keys that differ, and the command exits 1."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest

from cdcflow import Database
from cdcflow.events.files import EventFileWriter
from cdcflow.streams.states import StreamState
from cdcflow.streams.verify import verify
from cdcflow.table import CdcTable
from cdcflow.testing import run_mixed_writer
from tests.integration.streams.test_runner import running, wait_for, workload_stream

pytestmark = pytest.mark.integration


def test_verify_drains_compares_at_the_drain_and_names_what_differs(spark, tmp_path: Path):
    db, catalog = workload_stream(tmp_path, "CREATE CHANGE STREAM Everything FOR ALL", {
        "name": "lake", "backfill": "all",
        "destinations": [{"kind": "cdc_table", "warehouse": str(tmp_path / "warehouse")},
                         {"kind": "event_files", "root": str(tmp_path / "events")}]})
    run_mixed_writer(db.path, 7, 150)
    writer = multiprocessing.get_context("spawn").Process(target=run_mixed_writer,
                                                          args=(db.path, 3, 400))
    with running(tmp_path / "catalog.db", spark):
        wait_for(catalog, "lake", StreamState.RUNNING)
        writer.start()
        report = verify(catalog, "lake", wait_seconds=180)  # the writer goes on meanwhile
        assert report["how"] == "drained by verify", report
        assert report["equal"], json.dumps(report, indent=1)
        [accounts] = report["objects"]
        assert accounts["rows"]["source"] == accounts["rows"]["cdc_table"] == \
            accounts["rows"]["events_rebuilt"] > 0
        assert catalog.get("lake").state in (StreamState.STARTING, StreamState.RUNNING)
        writer.join(timeout=300)
        wait_for(catalog, "lake", StreamState.RUNNING)
        catalog.act("lake", "drain")
        wait_for(catalog, "lake", StreamState.PAUSED)
    run_mixed_writer(db.path, 11, 50)  # after the drain: verify reads at the drain's time
    again = verify(catalog, "lake")
    assert again["how"] == "on a drained stream" and again["equal"], again
    keys = tamper(tmp_path, db)
    code, out = cli_verify(tmp_path / "catalog.db", "lake")
    assert code == 1 and not out["equal"]
    [accounts] = out["objects"]
    table, events = accounts["cdc_table"], accounts["events"]
    assert (table["differ"], table["missing"]) == (1, 1), table
    assert [keys["changed"]] == [k[0] for k in table["sample_keys"]["differ"]]
    assert [keys["deleted"]] == [k[0] for k in table["sample_keys"]["missing"]]
    assert (events["differ"], events["missing"], events["extra"]) == (1, 0, 0), events
    assert [keys["changed"]] == [k[0] for k in events["sample_keys"]["differ"]]
    db.close()


def tamper(tmp_path: Path, db: Database) -> dict[str, int]:
    """Change one row and delete another in the CDC table behind the stream's back, and
    drop one event line from an event file."""
    rows = sorted(r["Id"] for r in db.scan("Accounts"))
    changed, deleted = rows[0], rows[1]
    table = CdcTable.open(tmp_path / "warehouse" / "Accounts")
    table.connection().append([
        {"Id": changed, "Owner": "tampered", "Balance": -1, "_CHANGE_TYPE": "UPSERT",
         "_CHANGE_SEQUENCE_NUMBER": "FFFFFFFFFFFFFFFF"},
        {"Id": deleted, "Owner": None, "Balance": None, "_CHANGE_TYPE": "DELETE",
         "_CHANGE_SEQUENCE_NUMBER": "FFFFFFFFFFFFFFFF"}])
    table.apply()
    files = EventFileWriter(tmp_path / "events", "lake").committed_files()
    victim = next(f for f in files if "Accounts" in f.parts)
    forged = json.loads(victim.read_text().splitlines()[0])
    forged |= {"uuid": "00000000-0000-5000-8000-000000000000", "read_method":
               "embedded-cdc-changestream", "sort_keys": [2**53, "0", "00000000", 0]}
    forged["payload"] |= {"Id": str(changed), "Owner": "forged"}
    with victim.open("a") as lines:
        lines.write(json.dumps(forged) + "\n")
    return {"changed": changed, "deleted": deleted}


def cli_verify(catalog: Path, name: str) -> tuple[int, dict]:
    result = subprocess.run([sys.executable, "-m", "cdcflow.cli.main", "verify", "--catalog",
                             str(catalog), name, "--json"], capture_output=True, text=True,
                            timeout=300, check=False)
    return result.returncode, json.loads(result.stdout)
