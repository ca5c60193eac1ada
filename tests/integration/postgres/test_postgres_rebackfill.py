"""Backfilling one table again while streaming goes on (`cdcflow streams backfill`), the DBLog
way: chunks read between low and high watermarks. A TRUNCATE makes the CDC table diverge (it
is reported, not applied); the table is backfilled again while a writer keeps updating,
deleting, inserting and moving keys, and the capture worker is SIGKILLed twice mid-way. At the
end the CDC table equals the source: rows the source lost are swept, none is applied twice."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from cdcflow.events.files import EventFileWriter, read_json_events
from cdcflow.localdb import LocalPostgres
from cdcflow.streams.catalog import Catalog
from cdcflow.table import CdcTable
from tests.integration.postgres.test_postgres_stream import cli, start_stream, wait

pytestmark = pytest.mark.integration
ROWS = 12_000


def write_until(pg: LocalPostgres, stop: threading.Event, seed: int) -> None:
    """Random small transactions on keys 1..8000 (updates, deletes, key moves) and new keys."""
    rng = random.Random(seed)
    conn = psycopg2.connect(pg.dsn(), password=pg.password)
    conn.autocommit = True
    fresh = 100_000
    with conn.cursor() as cur:
        while not stop.is_set():
            key = rng.randint(1, 8_000)
            match rng.randint(0, 9):
                case 0:
                    cur.execute("DELETE FROM items WHERE id = %s", (key,))
                case 1:
                    fresh += 1
                    cur.execute("UPDATE items SET id = %s WHERE id = %s", (fresh + 100_000, key))
                case 2 | 3:
                    fresh += 1
                    cur.execute("INSERT INTO items VALUES (%s, %s, 'new')", (fresh, key))
                case _:
                    cur.execute("UPDATE items SET v = v + 1, pad = %s WHERE id = %s",
                                (f"w{rng.random()}", key))
            time.sleep(0.002)
    conn.close()


def source_rows(pg_conn: Any) -> dict[int, dict[str, Any]]:
    with pg_conn.cursor() as cur:
        cur.execute("SELECT id, v, pad FROM items")
        return {r[0]: {"id": r[0], "v": r[1], "pad": r[2]} for r in cur.fetchall()}


def progress(catalog: Catalog, name: str = "pg-again") -> dict[str, Any]:
    return catalog.status(name).get("backfill_again") or {}


def kill_worker_mid_backfill(catalog: Catalog, chunks: int, name: str = "pg-again") -> None:
    """SIGKILL the capture worker once the request has done `chunks` chunks, not all."""
    deadline = time.monotonic() + 120
    while (state := progress(catalog, name)).get("chunks", 0) < chunks:
        assert time.monotonic() < deadline, f"{chunks} chunks backfilled again"
        time.sleep(0.01)  # polled closely: a chunk can take a few milliseconds
    assert not state["done"], f"the backfill ended before the kill at {chunks} chunks"
    pid = catalog.status(name)["capture"]["pid"]
    os.kill(pid, signal.SIGKILL)
    wait(lambda: catalog.status(name)["capture"].get("pid") not in (None, pid),
         "a restarted capture worker", 60)


def test_a_table_backfilled_again_while_streaming_equals_the_source(
        spark: Any, pg: LocalPostgres, pg_conn: Any, tmp_path: Path):
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, v int, pad text);"
                    "CREATE TABLE notes (body text)")
    catalog_path, catalog, stop, thread = start_stream(tmp_path, "pg-again", pg, spark,
                                                       chunk_rows=50)
    writing = threading.Event()
    writer = threading.Thread(target=write_until, args=(pg, writing, 7))
    try:
        wait(lambda: catalog.get("pg-again").state.value == "RUNNING", "RUNNING", 180)
        table = CdcTable.open(tmp_path / "warehouse" / "public.items")
        with pg_conn.cursor() as cur:  # streamed (a backfill of 50-row chunks takes long)
            cur.execute(f"INSERT INTO items SELECT g, g, 'p' FROM generate_series(1, {ROWS}) g")
        wait(lambda: len(table.lookup([(ROWS,)])), "the rows inserted first", 120)
        with pg_conn.cursor() as cur:  # the table diverges: the TRUNCATE is not applied
            cur.execute("TRUNCATE items; INSERT INTO items SELECT g, -g, 'again' "
                        "FROM generate_series(1, 8000) g")
        wait(lambda: len(table.lookup([(8000,)])) and table.lookup([(8000,)])[(8000,)]["v"]
             == -8000, "the rows inserted after the TRUNCATE", 120)
        writer.start()
        for bad, error in (("public.nothing", "InvalidArgument"),
                           ("public.notes", "InvalidArgument"),
                           ("private.items", "InvalidArgument")):
            assert cli(catalog_path, "backfill", "pg-again", bad, code=2)["error"] == error
        request = cli(catalog_path, "backfill", "pg-again", "public.items")
        assert cli(catalog_path, "backfill", "pg-again", "public.items",
                   code=2)["error"] == "FailedPrecondition"
        kill_worker_mid_backfill(catalog, 5)
        kill_worker_mid_backfill(catalog, 15)  # of ~160; CI saw 30, then 15, of ~80 too late
        swept = wait(lambda: catalog.status("pg-again").get("backfill_swept"), "the sweep", 300)
        writing.set()
        writer.join()
        cli(catalog_path, "drain", "pg-again")
        wait(lambda: catalog.get("pg-again").state.value == "PAUSED", "PAUSED", 180)
    finally:
        writing.set()
        stop.set()
        thread.join(timeout=120)
    state = progress(catalog)
    assert state["id"] == request["id"] == swept["id"] and state["done"]
    assert swept["rows_deleted"] == ROWS - 8000  # exactly the rows the TRUNCATE took
    assert {r["id"]: r for r in table.to_arrow().to_pylist()} == source_rows(pg_conn)
    errors = cli(catalog_path, "errors", "pg-again")
    assert any(e["object"] == "public.items" and "TRUNCATE" in e["message"] for e in errors)
    files = EventFileWriter(tmp_path / "events", "pg-again").committed_files()
    again = [e for f in files for e in read_json_events(f)
             if e["read_method"] == "postgresql-backfill" and e["payload"]["pad"] != "p"]
    assert again and all(e["sort_keys"] == [] for e in again)  # EV-6: no order there
    # a chunk read again after a kill gives its rows the same uuids: one uuid per key
    assert len({e["uuid"] for e in again}) == len({e["payload"]["id"] for e in again})


def test_a_table_dropped_mid_request_fails_the_request_and_capture_goes_on(
        spark: Any, pg: LocalPostgres, pg_conn: Any, tmp_path: Path):
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE doomed (id int PRIMARY KEY, v int);"
                    "CREATE TABLE kept (id int PRIMARY KEY, v int)")
    catalog_path, catalog, stop, thread = start_stream(
        tmp_path, "pg-again", pg, spark, ("public.doomed", "public.kept"), chunk_rows=50)

    def lands(key: int) -> None:
        with pg_conn.cursor() as cur:
            cur.execute("INSERT INTO kept VALUES (%s, %s)", (key, key))
        table = CdcTable.open(tmp_path / "warehouse" / "public.kept")
        wait(lambda: table.lookup([(key,)]), f"row {key} of kept in its CDC table", 120)

    try:
        wait(lambda: catalog.get("pg-again").state.value == "RUNNING", "RUNNING", 180)
        with pg_conn.cursor() as cur:  # streamed, not backfilled: the request reads them
            cur.execute("INSERT INTO doomed SELECT g, g FROM generate_series(1, 20000) g")
        request = cli(catalog_path, "backfill", "pg-again", "public.doomed")
        wait(lambda: progress(catalog).get("chunks", 0) >= 2, "two chunks read again")
        with pg_conn.cursor() as cur:
            cur.execute("DROP TABLE doomed")
        failed = wait(lambda: progress(catalog).get("failed") and progress(catalog),
                      "the request to fail", 60)
        lands(1)  # the capture goes on
        pid = catalog.status("pg-again")["capture"]["pid"]
        os.kill(pid, signal.SIGKILL)  # a restarted worker must not try the request again
        wait(lambda: catalog.status("pg-again")["capture"].get("pid") not in (None, pid),
             "a restarted capture worker", 60)
        lands(2)
        again = cli(catalog_path, "backfill", "pg-again", "public.kept")  # the next may come
        wait(lambda: catalog.status("pg-again").get("backfill_swept", {}).get("id")
             == again["id"], "the next request swept", 120)
    finally:
        stop.set()
        thread.join(timeout=120)
    assert failed["id"] == request["id"] and failed["done"] and failed["chunks"] < 400
    assert "doomed" in failed["failed"]
    errors = cli(catalog_path, "errors", "pg-again")
    assert any(e["object"] == "public.doomed" and ("does not exist" in e["message"] or
                                                   "dropped" in e["message"]) for e in errors)
    assert not any("FailedPrecondition" in e["message"] or "another capture worker" in
                   e["message"] for e in errors)
