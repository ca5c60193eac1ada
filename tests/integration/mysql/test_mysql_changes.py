"""MariaDB's binlog through the capture worker, the Spark pipeline, a CDC table and events
(issue 12): inserts, a multi-row transaction, updates (UPDATE-INSERT), a primary key that
changes (UPDATE-DELETE then UPDATE-INSERT: the old key disappears), deletes, ADD and DROP
COLUMN mid-stream with a new schema_key, and EV-4's source metadata."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cdcflow.clock import SYSTEM_CLOCK
from cdcflow.events.files import EventFileWriter, read_json_events
from cdcflow.localmaria import LocalMariaDB
from cdcflow.store.changelog import ChangeLog
from cdcflow.streams.backfill import run_backfill
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.setup import prepare_stream
from cdcflow.streams.sources import open_source
from cdcflow.table import CdcTable
from tests.integration.pipeline import drain

pytestmark = pytest.mark.integration


def definition_of(maria: LocalMariaDB, tmp_path: Path, name: str,
                  include: list[str]) -> StreamDefinition:
    return StreamDefinition.parse({
        "name": name, "include": include,
        "source": {"kind": "mysql", "host": "127.0.0.1", "port": maria.port, "user": "cdc",
                   "password_env": "CDCFLOW_TEST_MYSQL_PASSWORD", "databases": ["shop"]},
        "destinations": [{"kind": "cdc_table", "warehouse": str(tmp_path / "w")},
                         {"kind": "event_files", "root": str(tmp_path / "e"),
                          "format": "json"}]})


def captured(maria: LocalMariaDB, tmp_path: Path, name: str, include: list[str],
             changes: Any) -> tuple[Any, Catalog]:
    """Backfill, then run `changes()` under a capture worker until it has read them all."""
    definition = definition_of(maria, tmp_path, name, include)
    catalog = Catalog(tmp_path / "catalog.db")
    catalog.create(definition)
    setup = prepare_stream(definition, tmp_path)
    run_backfill(setup, catalog, SYSTEM_CLOCK)
    log = ChangeLog.open(setup.source.log_location()[0])
    stop = threading.Event()
    worker_source = open_source(definition, tmp_path)
    worker = threading.Thread(target=worker_source.capture, args=(log, stop))
    worker.start()
    try:
        changes()
        mark = setup.source.mark()
        deadline = time.monotonic() + 60
        while not setup.source.reached(log, mark):
            assert worker.is_alive(), "the capture worker stopped"
            assert time.monotonic() < deadline, "the capture did not reach the mark"
            time.sleep(0.05)
    finally:
        stop.set()
        worker.join()
    return setup, catalog


def test_changes_key_moves_and_schema_changes_reach_tables_and_events(
        spark: Any, maria: LocalMariaDB, tmp_path: Path):
    maria.sql("CREATE TABLE orders (id INT PRIMARY KEY, item VARCHAR(40), qty INT)",
              "INSERT INTO orders VALUES (1, 'pen', 1), (2, 'ink', 2), (3, 'cap', 3)",
              database="shop")

    def changes() -> None:
        maria.sql("START TRANSACTION", "INSERT INTO orders VALUES (4, 'pad', 4), (5, 'nib', 5)",
                  "UPDATE orders SET qty = 20 WHERE id = 2", "COMMIT",
                  "UPDATE orders SET id = 30 WHERE id = 3",
                  "DELETE FROM orders WHERE id = 1",
                  "ALTER TABLE orders ADD COLUMN note VARCHAR(20)",
                  "UPDATE orders SET note = 'x' WHERE id = 4",
                  "ALTER TABLE orders DROP COLUMN qty",
                  "UPDATE orders SET item = 'after drop' WHERE id = 5", database="shop")

    setup, _ = captured(maria, tmp_path, "shop-orders", ["shop.orders"], changes)
    drain(spark, setup, tmp_path)
    rows = {r["id"]: r for r in CdcTable.open(tmp_path / "w" / "shop.orders")
            .to_arrow().to_pylist()}
    assert sorted(rows) == [2, 4, 5, 30]  # the old key 3 disappeared
    assert rows[2]["qty"] == 20 and rows[4]["note"] == "x" and rows[5]["item"] == "after drop"
    assert rows[30]["item"] == "cap"
    files = EventFileWriter(tmp_path / "e", "shop-orders").committed_files()
    events = sorted((e for f in files for e in read_json_events(f)
                     if e["read_method"] == "mysql-cdc-binlog"), key=lambda e: e["sort_keys"])
    kinds = [(e["source_metadata"]["change_type"], e["payload"]["id"]) for e in events]
    assert kinds[:6] == [("INSERT", "4"), ("INSERT", "5"), ("UPDATE-INSERT", "2"),
                         ("UPDATE-DELETE", "3"), ("UPDATE-INSERT", "30"), ("DELETE", "1")]
    first = events[0]["source_metadata"]
    assert first["database"] == "shop" and first["table"] == "orders"
    assert first["primary_keys"] == ["id"] and first["is_deleted"] is False
    assert first["log_file"].startswith("mariadb-bin.") and first["log_position"] > 0
    assert events[0]["sort_keys"][:2] == [first["log_file"], first["log_position"]]
    assert len({e["schema_key"] for e in events}) == 3  # before ADD, after ADD, after DROP
