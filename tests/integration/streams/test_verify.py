"""`cdcflow verify` (issue 14): a running embedded stream is drained, compared at the drain's
log time while a writer goes on, and resumed; a stream whose CDC table and events were
tampered with is reported with the keys that differ, and the command exits 1."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cdcflow import Database
from cdcflow.events.files import EventFileWriter
from cdcflow.model.events import Event
from cdcflow.model.records import ColumnTypeInfo
from cdcflow.model.types import parse_type
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
    commit one more batch of events with a forged one (a writer's bug, not damage)."""
    rows = sorted(r["Id"] for r in db.scan("Accounts"))
    changed, deleted = rows[0], rows[1]
    table = CdcTable.open(tmp_path / "warehouse" / "Accounts")
    table.connection().append([
        {"Id": changed, "Owner": "tampered", "Balance": -1, "_CHANGE_TYPE": "UPSERT",
         "_CHANGE_SEQUENCE_NUMBER": "FFFFFFFFFFFFFFFF"},
        {"Id": deleted, "Owner": None, "Balance": None, "_CHANGE_TYPE": "DELETE",
         "_CHANGE_SEQUENCE_NUMBER": "FFFFFFFFFFFFFFFF"}])
    table.apply()
    writer = EventFileWriter(tmp_path / "events", "lake")
    last = max(int(m.stem[6:]) for m in (writer.base / "_manifests").glob("batch-[0-9]*"))
    types = tuple(ColumnTypeInfo(name, parse_type(kind), name == "Id", number) for
                  number, (name, kind) in enumerate(
                      [("Id", "INT64"), ("Owner", "STRING(64)"), ("Balance", "INT64")], 1))
    now = datetime.now(UTC)
    writer.write_batch(last + 1, [Event(
        "lake", "embedded-cdc-changestream", "Accounts", "forged", str(uuid.uuid4()), now, now,
        (2**53, "0", "00000000", 0), {"is_deleted": False, "primary_keys": ["Id"]},
        {"Id": changed, "Owner": "forged", "Balance": 1}, types)])
    return {"changed": changed, "deleted": deleted}


def test_a_damaged_event_file_is_reported_by_name(spark, tmp_path: Path):
    """Bytes changed in a committed event file: verify names the file (DataLoss) for the
    events, and still compares the CDC table."""
    db, catalog = workload_stream(tmp_path, "CREATE CHANGE STREAM Everything FOR ALL", {
        "name": "lake", "backfill": "all",
        "destinations": [{"kind": "cdc_table", "warehouse": str(tmp_path / "warehouse")},
                         {"kind": "event_files", "root": str(tmp_path / "events")}]})
    run_mixed_writer(db.path, 7, 60)
    with running(tmp_path / "catalog.db", spark):
        wait_for(catalog, "lake", StreamState.RUNNING)
        catalog.act("lake", "drain")
        wait_for(catalog, "lake", StreamState.PAUSED)
    victim = EventFileWriter(tmp_path / "events", "lake").committed_files()[0]
    victim.write_bytes(victim.read_bytes().replace(b'"Owner":"', b'"Owner":"X', 1))
    code, out = cli_verify(tmp_path / "catalog.db", "lake")
    [accounts] = out["objects"]
    assert code == 1 and accounts["cdc_table"]["equal"], out
    assert accounts["events"]["error"].startswith("DataLoss") and str(victim) in \
        accounts["events"]["error"]
    db.close()


def cli_verify(catalog: Path, name: str) -> tuple[int, dict]:
    result = subprocess.run([sys.executable, "-m", "cdcflow.cli.main", "verify", "--catalog",
                             str(catalog), name, "--json"], capture_output=True, text=True,
                            timeout=300, check=False)
    return result.returncode, json.loads(result.stdout)
