"""A PostgreSQL stream run as a user runs it: `cdcflow streams create/start/drain/status/
delete` around the runner, with its capture worker SIGKILLed mid-stream; the CDC table equals
the source, a table without a key goes to events only (and says so), and the password shows
nowhere."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdcflow.capture.postgres import connection
from cdcflow.errors import FailedPrecondition
from cdcflow.events.files import EventFileWriter, read_json_events
from cdcflow.localdb import LocalPostgres
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.runner import Runner
from cdcflow.streams.setup import prepare_stream
from tests.integration.streams.test_verify import cli_verify

pytestmark = pytest.mark.integration


def cli(catalog: Path, *args: str, code: int = 0) -> Any:
    """Run `cdcflow streams ... --json`; check its exit status; return its JSON output."""
    import subprocess

    result = subprocess.run([sys.executable, "-m", "cdcflow.cli.main", "streams", "--catalog",
                             str(catalog), *args, "--json"], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == code, result.stdout + result.stderr
    return json.loads(result.stdout)


def wait(condition: Any, what: str, seconds: float = 120) -> Any:
    deadline = time.monotonic() + seconds
    while not (value := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.2)
    return value


def write_definition(folder: Path, name: str, pg: LocalPostgres,
                     include: tuple[str, ...] = ("public.*",), **source: Any) -> Path:
    """A stream of every table of `public` (or of `include`) into CDC tables and JSON events
    under `folder`."""
    definition = folder / "pg.yaml"
    definition.write_text(yaml.safe_dump({
        "name": name, "backfill": "all", "include": list(include),
        "source": {"kind": "postgres", "dsn": pg.dsn(), "heartbeat_seconds": 1,
                   "password_env": "CDCFLOW_TEST_PG_PASSWORD", **source},
        "destinations": [{"kind": "cdc_table", "warehouse": str(folder / "warehouse")},
                         {"kind": "event_files", "root": str(folder / "events")}],
        "spark": {"trigger_seconds": 0.3}}))
    return definition


def start_stream(folder: Path, name: str, pg: LocalPostgres, spark: Any,
                 include: tuple[str, ...] = ("public.*",), **source: Any
                 ) -> tuple[Path, Catalog, threading.Event, threading.Thread]:
    """Create and start the stream through the CLI, and run a runner on a thread until the
    returned event is set."""
    catalog_path = folder / "catalog.db"
    cli(catalog_path, "create", str(write_definition(folder, name, pg, include, **source)))
    cli(catalog_path, "start", name)
    runner = Runner(catalog_path, spark, poll_seconds=0.2, backoff_seconds=0.2)
    stop = threading.Event()
    thread = threading.Thread(target=runner.run, args=(stop,))
    thread.start()
    return catalog_path, Catalog(catalog_path), stop, thread


def test_a_postgres_stream_end_to_end_through_the_cli_and_the_runner(
        spark: Any, pg: LocalPostgres, pg_conn: Any, tmp_path: Path):
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE accounts (id int PRIMARY KEY, owner text, balance "
                    "numeric(12,2)); CREATE TABLE history (id int, delta int);"
                    "INSERT INTO accounts SELECT g, 'o' || g, g FROM generate_series(1, 50) g;"
                    "INSERT INTO history VALUES (1, 1), (2, 2)")
    catalog_path, catalog, stop, thread = start_stream(tmp_path, "pg-shop", pg, spark)
    try:
        wait(lambda: catalog.get("pg-shop").state.value == "RUNNING", "RUNNING")
        first = wait(lambda: (catalog.status("pg-shop").get("capture") or {}).get("pid"),
                     "a capture worker")
        with pg_conn.cursor() as cur:
            cur.execute("UPDATE accounts SET balance = balance + 1 WHERE id <= 10;"
                        "DELETE FROM accounts WHERE id BETWEEN 11 AND 15;"
                        "INSERT INTO history VALUES (3, 3)")
        wait(lambda: (catalog.status("pg-shop").get("capture") or {}).get("position"),
             "the worker's position in the status")
        os.kill(first, signal.SIGKILL)
        wait(lambda: (catalog.status("pg-shop").get("capture") or {}).get("pid") not in
             (None, first), "a restarted worker", 60)
        with pg_conn.cursor() as cur:
            cur.execute("INSERT INTO accounts VALUES (100, 'new', 1.25);"
                        "UPDATE accounts SET owner = 'x' WHERE id = 20;"
                        "INSERT INTO history VALUES (4, 4)")
        cli(catalog_path, "drain", "pg-shop")
        wait(lambda: catalog.get("pg-shop").state.value == "PAUSED", "PAUSED", 180)
        status = cli(catalog_path, "status", "pg-shop")
    finally:
        stop.set()
        thread.join(timeout=120)
    code, report = cli_verify(catalog_path, "pg-shop")  # the table and the events, by verify
    assert code == 0 and report["how"] == "on a drained stream", report
    assert [(o["object"], o["rows"]) for o in report["objects"]] == [
        ("public.accounts", {"source": 46, "cdc_table": 46, "events_rebuilt": 46})]
    files = EventFileWriter(tmp_path / "events", "pg-shop").committed_files()
    events = [e for f in files for e in read_json_events(f)]
    history = [e for e in events if e["object"] == "public.history"]
    assert sorted(int(e["payload"]["id"]) for e in history) == [1, 2, 3, 4]
    assert {e["read_method"] for e in events} == {"postgresql-backfill", "postgres-cdc-wal"}
    cdc = [e for e in events if e["read_method"] == "postgres-cdc-wal"]
    assert all(set(e["source_metadata"]) == {"schema", "table", "tx_id", "lsn", "change_type",
                                             "is_deleted", "primary_keys"} for e in cdc)
    errors = cli(catalog_path, "errors", "pg-shop")
    assert any(e["object"] == "public.history" and "no primary key" in e["message"]
               for e in errors)
    assert any("capture worker exited" in e["message"] for e in errors)
    assert status["capture"]["position"]["end_lsn"]
    cli(catalog_path, "delete", "pg-shop")
    assert pg.sql("shop", "SELECT count(*) FROM pg_replication_slots").strip() == "0"
    assert pg.sql("shop", "SELECT count(*) FROM pg_publication").strip() == "0"
    exposed = [str(path) for path in tmp_path.rglob("*") if path.is_file()
               and pg.password.encode() in path.read_bytes()]
    assert exposed == [] and pg.password not in json.dumps(status) + json.dumps(errors)


def test_delete_keeps_the_slot_when_asked_and_names_missing_privileges(
        pg: LocalPostgres, pg_conn: Any, tmp_path: Path):
    pg.sql("shop", "CREATE ROLE weak LOGIN PASSWORD 'weakpw'")
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id int PRIMARY KEY)")
    definition = tmp_path / "pg.yaml"
    for name, dsn in (("keep", pg.dsn()), ("weak", pg.dsn(user="weak"))):
        definition.write_text(yaml.safe_dump({
            "name": name, "include": ["public.t"],
            "source": {"kind": "postgres", "dsn": dsn,
                       "password_env": "CDCFLOW_TEST_PG_PASSWORD"},
            "destinations": [{"kind": "event_files", "root": str(tmp_path / "events")}]}))
        cli(tmp_path / "catalog.db", "create", str(definition))
    catalog = Catalog(tmp_path / "catalog.db")
    setup = prepare_stream(catalog.get("keep").definition, tmp_path)
    setup.source.snapshot(list(setup.objects.values()), None)
    setup.source.close()
    cli(tmp_path / "catalog.db", "delete", "keep", "--keep-slot")
    assert pg.sql("shop", "SELECT slot_name FROM pg_replication_slots").strip() == \
        "cdcflow_keep"
    os.environ["CDCFLOW_TEST_PG_PASSWORD_WEAK"] = "weakpw"
    weak = catalog.get("weak").definition
    weak = weak.model_copy(update={"source": weak.source.model_copy(
        update={"password_env": "CDCFLOW_TEST_PG_PASSWORD_WEAK"})})
    setup = prepare_stream(weak, tmp_path)
    with pytest.raises(FailedPrecondition, match="ownership of the published tables"):
        setup.source.snapshot(list(setup.objects.values()), None)
    pg.sql("shop", "SELECT pg_drop_replication_slot('cdcflow_keep')")


def test_a_server_older_than_the_source_needs_is_refused_naming_its_version(
        pg: LocalPostgres, pg_conn: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The capture needs PostgreSQL 14 (pgoutput's 'messages' option): an older server is
    FailedPrecondition naming it and its version, before a slot or publication is made.
    This server (15) passes; with the minimum above its version, it is refused as an older
    one would be."""
    assert pg_conn.server_version >= connection.MIN_SERVER_VERSION
    connection.check_server_version(pg_conn, pg.dsn())
    above = (pg_conn.server_version // 10000 + 1) * 10000
    monkeypatch.setattr(connection, "MIN_SERVER_VERSION", above)
    definition = tmp_path / "pg.yaml"
    definition.write_text(yaml.safe_dump({
        "name": "old", "include": ["public.*"],
        "source": {"kind": "postgres", "dsn": pg.dsn(),
                   "password_env": "CDCFLOW_TEST_PG_PASSWORD"},
        "destinations": [{"kind": "event_files", "root": str(tmp_path / "events")}]}))
    cli(tmp_path / "catalog.db", "create", str(definition))
    with pytest.raises(FailedPrecondition, match=r"is version \d+\.\d+; the source needs "
                                                 rf"{above // 10000}\.0 or newer") as refused:
        prepare_stream(Catalog(tmp_path / "catalog.db").get("old").definition, tmp_path)
    assert "127.0.0.1" in str(refused.value) and pg.password not in str(refused.value)
    assert pg.sql("shop", "SELECT count(*) FROM pg_replication_slots WHERE slot_name = "
                          "'cdcflow_old'").strip() == "0"
    assert pg.sql("shop", "SELECT count(*) FROM pg_publication WHERE pubname = "
                          "'cdcflow_old'").strip() == "0"


def test_a_password_variable_not_set_is_failed_precondition_naming_it(
        pg: LocalPostgres, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The source's first look at the server keeps the error's type (it was an untyped
    'reading the tables' error), and the message names the variable, not a password."""
    monkeypatch.delenv("CDCFLOW_TEST_PG_UNSET", raising=False)
    definition = tmp_path / "pg.yaml"
    definition.write_text(yaml.safe_dump({
        "name": "unset", "include": ["public.*"],
        "source": {"kind": "postgres", "dsn": pg.dsn(), "password_env": "CDCFLOW_TEST_PG_UNSET"},
        "destinations": [{"kind": "event_files", "root": str(tmp_path / "events")}]}))
    cli(tmp_path / "catalog.db", "create", str(definition))
    with pytest.raises(FailedPrecondition, match=r"'CDCFLOW_TEST_PG_UNSET' .* is not set"):
        prepare_stream(Catalog(tmp_path / "catalog.db").get("unset").definition, tmp_path)
