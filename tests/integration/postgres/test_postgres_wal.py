"""Idle or unwatched WAL must not pile up in the slot: after 200 MB of writes to a table the
stream does not watch, the slot's retained WAL (pg_current_wal_lsn() - confirmed_flush_lsn)
is under 64 MB within 30 s; and `streams status` shows the retained WAL, with a warning when a
paused stream's slot holds more than its threshold."""

from __future__ import annotations

import multiprocessing
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from cdcflow.clock import FakeClock
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
