"""What PostgreSQL does to rows that a CDC tool must not get wrong: unchanged TOAST values on
UPDATE, a primary key that changes, REPLICA IDENTITY FULL, ADD and DROP COLUMN mid-stream,
and TRUNCATE; through the capture worker, the Spark pipeline, a CDC table and events."""

from __future__ import annotations

import random
import string
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cdcflow.capture.source import WorkerHooks
from cdcflow.events.files import EventFileWriter, read_json_events
from cdcflow.localdb import LocalPostgres
from cdcflow.store.changelog import ChangeLog
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.setup import prepare_stream
from cdcflow.streams.sources import open_source
from cdcflow.table import CdcTable
from tests.integration.pipeline import drain

pytestmark = pytest.mark.integration
BIG = "".join(random.Random(1).choices(string.ascii_letters, k=20_000))  # TOASTed, >8 kB


def captured(pg: LocalPostgres, tmp_path: Path, name: str, include: list[str],
             changes: Any) -> tuple[Any, Catalog]:
    """Backfill, then run `changes(conn)` under a capture worker, then the pipeline."""
    definition = StreamDefinition.parse({
        "name": name, "include": include,
        "source": {"kind": "postgres", "dsn": pg.dsn(), "heartbeat_seconds": 1,
                   "password_env": "CDCFLOW_TEST_PG_PASSWORD"},
        "destinations": [{"kind": "cdc_table", "warehouse": str(tmp_path / "w")},
                         {"kind": "event_files", "root": str(tmp_path / "e")}]})
    catalog = Catalog(tmp_path / "catalog.db")
    catalog.create(definition)
    setup = prepare_stream(definition, tmp_path)
    from cdcflow.clock import SYSTEM_CLOCK
    from cdcflow.streams.backfill import run_backfill

    run_backfill(setup, catalog, SYSTEM_CLOCK)
    log = ChangeLog.open(setup.source.log_location()[0])
    stop = threading.Event()
    reporter = open_source(definition, tmp_path, WorkerHooks(
        report=lambda obj, msg: catalog.record_error(name, obj, msg)))
    worker = threading.Thread(target=reporter.capture, args=(log, stop))
    worker.start()
    try:
        changes()
        mark = setup.source.mark()
        deadline = time.monotonic() + 60
        while not setup.source.reached(log, mark):
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        stop.set()
        worker.join()
    return setup, catalog


def test_toast_key_changes_full_identity_and_schema_changes(spark: Any, pg: LocalPostgres,
                                                            pg_conn: Any, tmp_path: Path):
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE docs (id int PRIMARY KEY, title text, body text, n int);"
                    "CREATE TABLE full_rows (id int PRIMARY KEY, v text);"
                    "ALTER TABLE full_rows REPLICA IDENTITY FULL;"
                    "INSERT INTO docs SELECT g, 't' || g, %s, g FROM generate_series(1, 6) g;"
                    "INSERT INTO full_rows VALUES (1, 'a'), (2, 'b')", (BIG,))

    def changes() -> None:
        with pg_conn.cursor() as cur:
            cur.execute("BEGIN;"  # one transaction: TOAST-unchanged rows and whole rows
                        "UPDATE docs SET title = 'changed' WHERE id IN (1, 2);"
                        "UPDATE docs SET body = 'small' WHERE id = 3;"
                        "INSERT INTO docs VALUES (7, 'new', %s, 7);"
                        "COMMIT", (BIG,))
            cur.execute("UPDATE docs SET id = 60 WHERE id = 6")  # the key moves
            cur.execute("DELETE FROM full_rows WHERE id = 1; UPDATE full_rows SET v = 'bb'")
            cur.execute("ALTER TABLE docs ADD COLUMN tag text;"
                        "UPDATE docs SET tag = 'x' WHERE id = 4;"
                        "ALTER TABLE docs DROP COLUMN n;"
                        "UPDATE docs SET title = 'after drop' WHERE id = 5")
            cur.execute("TRUNCATE full_rows")

    setup, catalog = captured(pg, tmp_path, "docs", ["public.docs", "public.full_rows"],
                              changes)
    drain(spark, setup, tmp_path)
    docs = {r["id"]: r for r in CdcTable.open(tmp_path / "w" / "public.docs")
            .to_arrow().to_pylist()}
    assert sorted(docs) == [1, 2, 3, 4, 5, 7, 60]
    assert docs[1]["title"] == "changed" and docs[1]["body"] == BIG  # never overwritten
    assert docs[3]["body"] == "small" and docs[7]["body"] == BIG and docs[60]["body"] == BIG
    assert docs[4]["tag"] == "x" and docs[5]["n"] is None and docs[1]["n"] == 1  # kept
    full = {r["id"]: r["v"] for r in CdcTable.open(tmp_path / "w" / "public.full_rows")
            .to_arrow().to_pylist()}
    assert full == {2: "bb"}  # the TRUNCATE is not applied; it is reported
    (truncate,) = [e for e in catalog.errors("docs") if "TRUNCATE" in e["message"]]
    assert truncate["object"] == "public.full_rows"
    files = EventFileWriter(tmp_path / "e", "docs").committed_files()
    events = [e for f in files for e in read_json_events(f)
              if e["read_method"] == "postgres-cdc-wal"]
    updated = [e for e in events if e["object"] == "public.docs"
               and e["payload"]["id"] in ("1", "2")]
    assert updated and all(e["payload"]["body"] == BIG for e in updated)  # whole rows
    moved = [e for e in sorted(events, key=lambda e: e["sort_keys"])
             if e["payload"].get("id") in ("6", "60")]
    assert [(e["source_metadata"]["change_type"], e["payload"]["id"]) for e in moved] == [
        ("DELETE", "6"), ("INSERT", "60")]
    assert moved[1]["payload"]["body"] == BIG  # taken from the row deleted at the old key
    deleted = [(e["source_metadata"]["change_type"], e["payload"]) for e in
               sorted(events, key=lambda e: e["sort_keys"]) if e["object"] == "public.full_rows"]
    assert deleted == [("DELETE", {"id": "1", "v": "a"}), ("UPDATE", {"id": "2", "v": "bb"})]
    keys = {e["schema_key"] for e in events if e["object"] == "public.docs"}
    assert len(keys) == 3  # before ADD COLUMN, after it, after DROP COLUMN
