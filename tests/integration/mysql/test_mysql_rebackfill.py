"""Backfilling MySQL tables again while the binlog capture goes on, through the CLI and the
runner (issue 12):

- `cdcflow streams backfill NAME OBJECT` after a TRUNCATE (reported, not applied), while a
  writer updates, deletes, inserts and moves keys and the capture worker is SIGKILLed twice
  mid-way: at the end the CDC table equals the source, and exactly the rows the TRUNCATE
  took are swept;
- a binlog purged while the runner is away: the default stream fails permanently with an
  error naming the lost position, and a stream with `on_position_lost: backfill` goes on
  from the server's position and backfills every table again, so that changes, inserts and
  deletes made while the position was lost all reach its tables."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdcflow.localmaria import LocalMariaDB
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.runner import Runner
from cdcflow.table import CdcTable
from tests.integration.postgres.test_postgres_rebackfill import kill_worker_mid_backfill, progress
from tests.integration.postgres.test_postgres_stream import cli, wait
from tests.integration.streams.test_verify import cli_verify

pytestmark = pytest.mark.integration
ROWS = 6_000


def write_definition(folder: Path, name: str, maria: LocalMariaDB, **source: Any) -> Path:
    definition = folder / f"{name}.yaml"
    definition.write_text(yaml.safe_dump({
        "name": name, "backfill": "all", "include": ["shop.*"],
        "source": {"kind": "mysql", "host": "127.0.0.1", "port": maria.port, "user": "cdc",
                   "password_env": "CDCFLOW_TEST_MYSQL_PASSWORD", "databases": ["shop"],
                   "heartbeat_seconds": 0.5, **source},
        "destinations": [{"kind": "cdc_table", "warehouse": str(folder / name / "warehouse")},
                         {"kind": "event_files", "root": str(folder / name / "events"),
                          "format": "avro"}],
        "spark": {"trigger_seconds": 0.3}}))
    return definition


def start_runner(catalog_path: Path, spark: Any) -> tuple[threading.Event, threading.Thread]:
    runner = Runner(catalog_path, spark, poll_seconds=0.2, backoff_seconds=0.2)
    stop = threading.Event()
    thread = threading.Thread(target=runner.run, args=(stop,))
    thread.start()
    return stop, thread


def write_until(maria: LocalMariaDB, stop: threading.Event, seed: int) -> None:
    """Random small transactions on keys 1..4000 (updates, deletes, key moves) and new keys."""
    rng = random.Random(seed)
    conn = maria.connect(database="shop", user="root", password="")
    fresh = 100_000
    with conn.cursor() as cur:
        while not stop.is_set():
            key = rng.randint(1, 4_000)
            match rng.randint(0, 9):
                case 0:
                    cur.execute("DELETE FROM items WHERE id = %s", (key,))
                case 1:
                    fresh += 1
                    cur.execute("UPDATE IGNORE items SET id = %s WHERE id = %s",
                                (fresh + 100_000, key))
                case 2 | 3:
                    fresh += 1
                    cur.execute("INSERT INTO items VALUES (%s, %s, 'new')", (fresh, key))
                case _:
                    cur.execute("UPDATE items SET v = v + 1, pad = %s WHERE id = %s",
                                (f"w{rng.random():.6f}", key))
            time.sleep(0.002)
    conn.close()


def source_rows(maria: LocalMariaDB, table: str) -> dict[int, dict[str, Any]]:
    rows = maria.sql(f"SELECT id, v, pad FROM {table}", database="shop")
    return {r[0]: {"id": r[0], "v": r[1], "pad": r[2]} for r in rows}


def table_rows(root: Path) -> dict[int, dict[str, Any]]:
    return {r["id"]: {k: r[k] for k in ("id", "v", "pad")}
            for r in CdcTable.open(root).to_arrow().to_pylist()}


def test_discover_through_the_cli_lists_database_dot_table(maria: LocalMariaDB,
                                                            tmp_path: Path):
    import json
    import subprocess
    import sys

    maria.sql("DROP TABLE IF EXISTS items, notes, parts",
              "CREATE TABLE items (id INT PRIMARY KEY, v INT, pad VARCHAR(40))",
              "CREATE TABLE notes (body TEXT)", database="shop")
    result = subprocess.run([sys.executable, "-m", "cdcflow.cli.main", "discover",
                             str(write_definition(tmp_path, "seen", maria)), "--json"],
                            capture_output=True, text=True, timeout=120, check=True)
    found = {o["object"]: o["fields"] for o in json.loads(result.stdout)}
    assert set(found) == {"shop.items", "shop.notes"}
    assert [(f["name"], f["type"], f["primary_key_position"]) for f in found["shop.items"]] \
        == [("id", "INT64", 1), ("v", "INT64", None), ("pad", "STRING(MAX)", None)]
    assert maria.password not in result.stdout + result.stderr


def test_a_table_backfilled_again_while_streaming_equals_the_source(
        spark: Any, maria: LocalMariaDB, tmp_path: Path):
    maria.sql("DROP TABLE IF EXISTS items, notes, parts",
              "CREATE TABLE items (id INT PRIMARY KEY, v INT, pad VARCHAR(40))",
              "CREATE TABLE notes (body TEXT)",
              f"INSERT INTO items SELECT seq, seq, 'p' FROM seq_1_to_{ROWS}", database="shop")
    catalog_path = tmp_path / "catalog.db"
    cli(catalog_path, "create", str(write_definition(tmp_path, "my-again", maria,
                                                     chunk_rows=100)))
    cli(catalog_path, "start", "my-again")
    catalog = Catalog(catalog_path)
    stop, thread = start_runner(catalog_path, spark)
    writing = threading.Event()
    writer = threading.Thread(target=write_until, args=(maria, writing, 7))
    root = tmp_path / "my-again" / "warehouse" / "shop.items"
    try:
        wait(lambda: catalog.get("my-again").state.value == "RUNNING", "RUNNING", 180)
        maria.sql("TRUNCATE TABLE items",  # the table diverges: the TRUNCATE is not applied
                  "INSERT INTO items SELECT seq, -seq, 'again' FROM seq_1_to_4000",
                  database="shop")
        table = CdcTable.open(root)
        wait(lambda: (table.lookup([(4000,)]).get((4000,)) or {}).get("v") == -4000,
             "the rows inserted after the TRUNCATE", 120)
        writer.start()
        for bad in ("shop.nothing", "shop.notes", "other.items"):
            assert cli(catalog_path, "backfill", "my-again", bad, code=2)["error"] == \
                "InvalidArgument"
        request = cli(catalog_path, "backfill", "my-again", "shop.items")
        assert cli(catalog_path, "backfill", "my-again", "shop.items",
                   code=2)["error"] == "FailedPrecondition"
        kill_worker_mid_backfill(catalog, 5, "my-again")
        kill_worker_mid_backfill(catalog, 20, "my-again")
        swept = wait(lambda: catalog.status("my-again").get("backfill_swept"), "the sweep", 300)
        writing.set()
        writer.join()
        cli(catalog_path, "drain", "my-again")
        wait(lambda: catalog.get("my-again").state.value == "PAUSED", "PAUSED", 180)
    finally:
        writing.set()
        stop.set()
        thread.join(timeout=120)
    state = progress(catalog, "my-again")
    assert state["id"] == request["id"] == swept["id"] and state["done"]
    assert swept["rows_deleted"] == ROWS - 4000  # exactly the rows the TRUNCATE took
    assert table_rows(root) == source_rows(maria, "items")
    code, report = cli_verify(catalog_path, "my-again")  # the table is mended; the events
    [items] = report["objects"]  # still hold the rows the TRUNCATE took (no event deletes
    assert code == 1 and items["cdc_table"]["equal"], report  # them), and verify says so
    assert (items["events"]["extra"], items["events"]["missing"]) == (ROWS - 4000, 0)
    errors = cli(catalog_path, "errors", "my-again")
    assert any(e["object"] == "shop.items" and "TRUNCATE" in e["message"] for e in errors)


def swept_last(catalog: Catalog, name: str, object_name: str) -> bool:
    status = catalog.status(name)
    return not status.get("backfill_queue") and \
        (status.get("backfill_swept") or {}).get("object") == object_name


def purge_binlogs(maria: LocalMariaDB) -> None:
    """Start a new binlog and purge every older one (a dump thread that is still ending, or
    the binlog checkpoint, holds a file for a moment: PURGE again until it is gone)."""
    maria.sql("FLUSH BINARY LOGS")
    newest = maria.sql("SHOW MASTER STATUS")[0][0]
    deadline = time.monotonic() + 30
    while [r[0] for r in maria.sql("SHOW BINARY LOGS")] != [newest]:
        assert time.monotonic() < deadline, "PURGE BINARY LOGS kept an older file"
        maria.sql(f"PURGE BINARY LOGS TO '{newest}'")
        time.sleep(0.1)


def test_a_purged_binlog_fails_the_stream_or_backfills_it_again(
        spark: Any, maria: LocalMariaDB, tmp_path: Path):
    maria.sql("DROP TABLE IF EXISTS items, notes, parts",
              "CREATE TABLE items (id INT PRIMARY KEY, v INT, pad VARCHAR(40))",
              "CREATE TABLE parts (id INT PRIMARY KEY, v INT, pad VARCHAR(40), "
              "made DATETIME(6) DEFAULT '2024-01-02 03:04:05.123456', price DECIMAL(9,2) "
              "DEFAULT 12.34)",
              "INSERT INTO items SELECT seq, seq, 'p' FROM seq_1_to_3000",
              "INSERT INTO parts (id, v, pad) SELECT seq, seq, 'p' FROM seq_1_to_500",
              database="shop")
    catalog_path = tmp_path / "catalog.db"
    cli(catalog_path, "create", str(write_definition(tmp_path, "lost-fail", maria)))
    cli(catalog_path, "create", str(write_definition(
        tmp_path, "lost-again", maria, on_position_lost="backfill", chunk_rows=250)))
    for name in ("lost-fail", "lost-again"):
        cli(catalog_path, "start", name)
    catalog = Catalog(catalog_path)
    stop, thread = start_runner(catalog_path, spark)
    try:
        for name in ("lost-fail", "lost-again"):
            wait(lambda name=name: (catalog.status(name).get("capture") or {}).get("position"),
                 f"{name} capturing", 240)
    finally:
        stop.set()
        thread.join(timeout=120)
    stored = catalog.status("lost-fail")["capture"]["position"]
    maria.sql("UPDATE items SET v = -v WHERE id <= 100", "DELETE FROM items WHERE id > 2900",
              "DELETE FROM parts WHERE id <= 50", database="shop")
    purge_binlogs(maria)
    maria.sql("INSERT INTO items VALUES (5000, 5000, 'after the purge')", database="shop")
    stop, thread = start_runner(catalog_path, spark)
    try:
        wait(lambda: catalog.get("lost-fail").state.value == "FAILED_PERMANENTLY",
             "the default stream to fail", 120)
        wait(lambda: swept_last(catalog, "lost-again", "shop.parts"), "both tables swept", 300)
        maria.sql("UPDATE parts SET pad = 'streamed' WHERE id = 60", database="shop")
        cli(catalog_path, "drain", "lost-again")
        wait(lambda: catalog.get("lost-again").state.value == "PAUSED", "PAUSED", 180)
    finally:
        stop.set()
        thread.join(timeout=120)
    errors = [e["message"] for e in cli(catalog_path, "errors", "lost-fail")]
    position = f"{stored['log_file']}:{stored['log_position']}"
    assert any("PositionLost" in m and position in m and "on_position_lost: backfill" in m
               for m in errors), errors
    assert any("backfilling again: shop.items, shop.parts" in e["message"]
               for e in cli(catalog_path, "errors", "lost-again"))
    warehouse = tmp_path / "lost-again" / "warehouse"
    for table in ("items", "parts"):
        assert table_rows(warehouse / f"shop.{table}") == source_rows(maria, table), table
    parts = CdcTable.open(warehouse / "shop.parts").to_arrow().to_pylist()
    assert {(str(r["made"]), str(r["price"])) for r in parts} == {
        ("2024-01-02 03:04:05.123456+00:00", "12.34")}  # read again, types kept
    events = avro_events(tmp_path / "lost-again" / "events", "lost-again")
    again = [e for e in events if e.read_method == "mysql-backfill-fulldump" and
             e.object == "shop.items" and e.payload["id"] == 1]
    assert sorted(e.payload["v"] for e in again) == [-1, 1]  # first backfill, then again
    streamed = [e for e in events if e.read_method == "mysql-cdc-binlog"]
    assert [(e.payload["pad"], e.source_metadata["change_type"]) for e in streamed] == \
        [("streamed", "UPDATE-INSERT")]
    metadata = streamed[0].source_metadata
    assert (metadata["database"], metadata["table"], metadata["is_deleted"]) == \
        ("shop", "parts", False) and metadata["log_file"].startswith("mariadb-bin.")


def avro_events(root: Path, stream: str) -> list[Any]:
    """Every event of the stream's Avro files, in file order."""
    from cdcflow.events.avro_format import read_avro
    from cdcflow.events.files import EventFileWriter

    events = []
    for path in EventFileWriter(root, stream).committed_files():
        with open(path, "rb") as source:
            events += list(read_avro(source))
    return events
