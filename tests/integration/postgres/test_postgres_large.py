"""A transaction of 1,000,000 rows is captured in one piece, and the capture worker's
resident memory stays under 500 MB (its peak, VmHWM, read from /proc)."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest

from cdcflow.localdb import LocalPostgres
from cdcflow.store.changelog import ChangeLog
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.sources import open_source
from cdcflow.streams.workers import run_capture

pytestmark = pytest.mark.integration
ROWS = 1_000_000


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_a_million_row_transaction_in_one_piece_in_bounded_memory(pg: LocalPostgres,
                                                                 pg_conn: Any, tmp_path: Path):
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE big (id int PRIMARY KEY, v int, note text)")
    definition = StreamDefinition.parse({
        "name": "big", "include": ["public.big"],
        "source": {"kind": "postgres", "dsn": pg.dsn(), "heartbeat_seconds": 1,
                   "password_env": "CDCFLOW_TEST_PG_PASSWORD"},
        "destinations": [{"kind": "event_files", "root": str(tmp_path / "e")}]})
    catalog = Catalog(tmp_path / "catalog.db")
    source = open_source(definition, tmp_path)
    source.snapshot([o for o in source.discover() if o.name == "public.big"], None)
    worker = multiprocessing.get_context("spawn").Process(
        target=run_capture, args=(definition.model_dump_json(), catalog.path))
    worker.start()
    try:
        with pg_conn.cursor() as cur:
            cur.execute("INSERT INTO big SELECT g, g, 'row ' || g FROM "
                        "generate_series(1, %s) g", (ROWS,))
        log = ChangeLog.open(source.log_location()[0])
        mark = source.mark()
        deadline = time.monotonic() + 600
        peak = 0.0
        while not source.reached(log, mark):
            assert worker.is_alive() and time.monotonic() < deadline, catalog.errors("big")
            peak = max(peak, peak_rss_mb(worker.pid))
            time.sleep(0.5)
        peak = max(peak, peak_rss_mb(worker.pid))
    finally:
        worker.terminate()
        worker.join()
    mods, stamps, transactions = 0, set(), set()
    for partition in log.partitions("changes"):
        for kind, record in log.read_log_bodies("changes", partition.token,
                                                log.earliest_readable("changes"),
                                                log.current_timestamp()):
            if kind == "data":
                mods += len(record["mods"])
                stamps.add(record["commit_timestamp"])
                transactions.add(record["source"]["tx_id"])
    assert (mods, len(stamps), len(transactions)) == (ROWS, 1, 1)
    assert peak < 500, f"the capture worker's peak resident memory was {peak:.0f} MB"
