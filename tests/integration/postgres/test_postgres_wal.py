"""Idle or unwatched WAL must not pile up in the slot: after 200 MB of writes to a table the
stream does not watch, the slot's retained WAL (pg_current_wal_lsn() - confirmed_flush_lsn)
is under 64 MB within 30 s; and `streams status` shows the retained WAL, with a warning when a
paused stream's slot holds more than its threshold."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from psycopg2.extras import LogicalReplicationConnection

from cdcflow.clock import FakeClock
from cdcflow.errors import FailedPrecondition, NotFound
from cdcflow.localdb import LocalPostgres
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.runner import Runner
from cdcflow.streams.source_watch import SOURCE_STATUS_SECONDS
from cdcflow.streams.sources import open_source
from cdcflow.streams.workers import run_capture

pytestmark = pytest.mark.integration
MB = 1024 * 1024


def definition(pg: LocalPostgres, tmp_path: Path, name: str, **source: Any) -> StreamDefinition:
    return StreamDefinition.parse({
        "name": name, "include": ["public.watched"],
        "source": {"kind": "postgres", "dsn": pg.dsn(),
                   "password_env": "CDCFLOW_TEST_PG_PASSWORD"} | source,
        "destinations": [{"kind": "event_files", "root": str(tmp_path / "e")}]})


def test_unwatched_writes_do_not_pile_up_in_the_slot(pg: LocalPostgres, pg_conn: Any,
                                                      tmp_path: Path):
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE watched (id int PRIMARY KEY);"
                    "CREATE TABLE noise (id int, pad text)")
    stream = definition(pg, tmp_path, "wal")  # the default heartbeat: every 10 s
    source = open_source(stream, tmp_path)
    source.release(source.snapshot([o for o in source.discover()
                                    if o.name == "public.watched"], None))
    worker = multiprocessing.get_context("spawn").Process(
        target=run_capture, args=(stream.model_dump_json(), str(tmp_path / "catalog.db")))
    worker.start()
    try:
        with pg_conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_lsn()")
            (before,) = cur.fetchone()
            for batch in range(22):  # over 200 MB of WAL for the table nobody watches
                cur.execute("INSERT INTO noise SELECT g, (SELECT string_agg(md5(random()::text),"
                            " '') FROM generate_series(1, 30) WHERE g > 0) "
                            "FROM generate_series(%s, %s) g", (batch * 10000 + 1,
                                                                (batch + 1) * 10000))
            cur.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (before,))
            (written,) = cur.fetchone()
        assert written > 200 * MB
        deadline = time.monotonic() + 30
        while (retained := source.slot_status()["retained_wal_bytes"]) >= 64 * MB:
            assert time.monotonic() < deadline, f"{retained / MB:.0f} MB still retained"
            time.sleep(0.5)
    finally:
        worker.terminate()
        worker.join()


def test_a_paused_stream_holding_wal_is_warned_about(pg: LocalPostgres, pg_conn: Any,
                                                      tmp_path: Path):
    stream = definition(pg, tmp_path, "paused", slot="paused_slot",
                        publication="paused_pub", retained_wal_warning_mb=1)
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS watched (id int PRIMARY KEY)")
    source = open_source(stream, tmp_path)
    source.release(source.snapshot([o for o in source.discover()
                                    if o.name == "public.watched"], None))
    with pg_conn.cursor() as cur:
        cur.execute("INSERT INTO watched SELECT generate_series(1, 30000)")
    catalog = Catalog(tmp_path / "catalog.db")
    catalog.create(stream)
    catalog.act("paused", "start")
    catalog.act("paused", "pause")
    runner = Runner(tmp_path / "catalog.db", spark=None)
    runner.step()
    status = catalog.status("paused")
    assert status["source"]["slot"] == "paused_slot"
    assert status["source"]["retained_wal_bytes"] > MB
    (warning,) = status["warnings"]
    assert "paused stream's slot holds" in warning
    assert [e["message"] for e in catalog.errors("paused")] == [warning]
    source.drop_slot()


def test_a_source_away_is_said_in_the_status_and_fails_no_stream(pg: LocalPostgres,
                                                                  pg_conn: Any, tmp_path: Path):
    """The server restarts under the runner's look at the slot: the status says the source is
    away, the stream keeps its state and records no error, and the next look connects
    again (a restart failed the campaign's stream for good once, three such in a row)."""
    stream = definition(pg, tmp_path, "away", slot="away_slot", publication="away_pub")
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS watched (id int PRIMARY KEY)")
    source = open_source(stream, tmp_path)
    source.release(source.snapshot([o for o in source.discover()
                                    if o.name == "public.watched"], None))
    clock = FakeClock()
    catalog = Catalog(tmp_path / "catalog.db", clock)
    catalog.create(stream)
    catalog.act("away", "start")
    catalog.act("away", "pause")
    runner = Runner(tmp_path / "catalog.db", spark=None, clock=clock)
    runner.step()
    assert catalog.status("away")["source"]["slot"] == "away_slot"
    pg.restart("fast")
    clock.advance(timedelta(seconds=SOURCE_STATUS_SECONDS))
    runner.step()
    said = catalog.status("away")["source"]
    assert "reading the status of replication slot 'away_slot'" in said["error"], said
    assert catalog.get("away").state.value == "PAUSED" and catalog.errors("away") == []
    clock.advance(timedelta(seconds=SOURCE_STATUS_SECONDS))
    runner.step()
    assert catalog.status("away")["source"]["slot"] == "away_slot"
    open_source(stream, tmp_path).drop_slot()  # the first one's connection died


def test_a_slot_a_reader_holds_is_not_dropped_and_the_stream_not_deleted(
        pg: LocalPostgres, pg_conn: Any, tmp_path: Path):
    """Deleting a stream while something still reads its slot (a capture worker on its way
    out, say) waits a moment, then fails naming the slot and the holder; the stream stays in
    the catalog and the slot on the server. Once the reader lets go, the delete drops both.
    (The drop used to skip an active slot silently, leaving it to keep WAL for ever.)"""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS watched (id int PRIMARY KEY)")
    stream = definition(pg, tmp_path, "held", slot="held_slot", publication="held_pub")
    source = open_source(stream, tmp_path)
    source.release(source.snapshot([o for o in source.discover()
                                    if o.name == "public.watched"], None))
    catalog = Catalog(tmp_path / "catalog.db")
    catalog.create(stream)
    reader = psycopg2.connect(pg.dsn(), password=pg.password,
                              connection_factory=LogicalReplicationConnection)
    reader.cursor().start_replication(slot_name="held_slot", decode=False, options={
        "proto_version": "1", "publication_names": "held_pub"})
    deadline = time.monotonic() + 30
    while (holder := slot_holder(pg_conn, "held_slot")) is None:
        assert time.monotonic() < deadline, "the reader never held the slot"
        time.sleep(0.05)
    source.slot_release_seconds = 0.5
    with pytest.raises(FailedPrecondition, match=f"'held_slot' is in use by server process "
                                                 f"{holder}"):
        remove_source_of(source)
    assert slot_exists(pg_conn, "held_slot")
    refused = cli_delete(tmp_path, "held")  # waits SLOT_RELEASE_SECONDS
    assert refused.returncode != 0 and "'held_slot' is in use" in refused.stderr, refused
    assert catalog.get("held").definition.name == "held"  # still there
    reader.close()
    deleted = cli_delete(tmp_path, "held")
    assert deleted.returncode == 0, deleted
    assert not slot_exists(pg_conn, "held_slot")
    with pytest.raises(NotFound):
        catalog.get("held")


def remove_source_of(source: Any) -> None:
    try:
        source.remove()
    finally:
        source.close()


def cli_delete(tmp_path: Path, name: str) -> Any:
    return subprocess.run([sys.executable, "-m", "cdcflow.cli.main", "streams", "--catalog",
                           str(tmp_path / "catalog.db"), "delete", name], capture_output=True,
                          text=True, timeout=120, check=False)


def slot_holder(conn: Any, slot: str) -> int | None:
    with conn.cursor() as cur:
        cur.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        row = cur.fetchone()
    return None if row is None else row[0]


def slot_exists(conn: Any, slot: str) -> bool:
    with conn.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        return cur.fetchone() is not None
