"""Every PostgreSQL type the source maps, by snapshot and by stream: the same value both ways,
and the value expected of its unified type (numbers exact, timestamps in UTC whatever the
session's TimeZone, NaN and ±Infinity kept, one-dimensional arrays)."""

from __future__ import annotations

import math
import threading
import time
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from cdcflow.follow import follow_change_stream
from cdcflow.localdb import LocalPostgres
from cdcflow.store.changelog import ChangeLog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.sources import open_source

pytestmark = pytest.mark.integration

COLUMNS = """
    id int PRIMARY KEY, i2 int2, i4 int4, i8 int8, n numeric(12, 3), nu numeric,
    f4 float4, f8 float8, t text, vc varchar(10), c char(5), b bool, d date, tm time,
    ts timestamp, tz timestamptz, j json, jb jsonb, by bytea, u uuid, e mood,
    ai int4[], at text[]
"""
ROWS = [
    "(%s, -32768, 2147483647, -9223372036854775808, 123456789.125, "
    "'123456789012345678901234567890.123456789', 'NaN', 'Infinity', 'héllo ✓', 'short', "
    "'ab', true, '2026-02-28', '13:45:01.5', '2026-03-01 12:00:00.123456', "
    "'2026-03-01 12:00:00', '{\"b\": [1, 2], \"a\": null}', '{\"z\": 1.5}', "
    "'\\x00ff10', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 'sad', '{1,NULL,3}', "
    "'{\"a,b\",NULL,\"q\\\"uote\"}')",
    "(%s, NULL, NULL, NULL, NULL, NULL, '-Infinity', 'NaN', NULL, NULL, NULL, NULL, NULL, "
    "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, '{}', NULL)",
]


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b and type(a) is type(b))


def insert(conn: Any, first: int) -> None:
    with conn.cursor() as cur:
        cur.execute("SET TimeZone = 'America/New_York'")  # the client's zone must not matter
        for offset, row in enumerate(ROWS):
            cur.execute(f"INSERT INTO kinds VALUES {row}", (first + offset,))


def test_each_type_arrives_the_same_by_snapshot_and_by_stream(pg: LocalPostgres, pg_conn: Any,
                                                              tmp_path: Path):
    with pg_conn.cursor() as cur:
        cur.execute(f"CREATE TYPE mood AS ENUM ('sad', 'ok'); CREATE TABLE kinds ({COLUMNS})")
    insert(pg_conn, 1)
    definition = StreamDefinition.parse({
        "name": "kinds", "include": ["public.kinds"],
        "source": {"kind": "postgres", "dsn": pg.dsn(), "heartbeat_seconds": 1,
                   "password_env": "CDCFLOW_TEST_PG_PASSWORD"},
        "destinations": [{"kind": "event_files", "root": str(tmp_path / "e")}]})
    source = open_source(definition, tmp_path)
    (item,) = [o for o in source.discover() if o.name == "public.kinds"]
    assert {c.name: c.type.ddl() for c in item.columns} == {
        "id": "INT64", "i2": "INT64", "i4": "INT64", "i8": "INT64", "n": "NUMERIC(12, 3)",
        "nu": "STRING(MAX)", "f4": "FLOAT64", "f8": "FLOAT64", "t": "STRING(MAX)",
        "vc": "STRING(MAX)", "c": "STRING(MAX)", "b": "BOOL", "d": "DATE",
        "tm": "STRING(MAX)", "ts": "TIMESTAMP", "tz": "TIMESTAMP", "j": "JSON", "jb": "JSON",
        "by": "BYTES(MAX)", "u": "STRING(MAX)", "e": "STRING(MAX)", "ai": "ARRAY<INT64>",
        "at": "ARRAY<STRING(MAX)>"}
    snapshot = source.snapshot([item], None)
    backfilled: list[dict[str, Any]] = []
    source.backfill(snapshot, [item], lambda _, rows, after: backfilled.extend(rows))
    source.release(snapshot)
    log = ChangeLog.open(source.log_location()[0])
    stop = threading.Event()
    worker = threading.Thread(target=open_source(definition, tmp_path).capture, args=(log, stop))
    worker.start()
    try:
        insert(pg_conn, 101)
        mark = source.mark()
        deadline = time.monotonic() + 60
        while not source.reached(log, mark):
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        stop.set()
        worker.join()
    records = follow_change_stream(log, "changes", snapshot.cdc_start,
                                   log.current_timestamp()).records
    streamed = {keys["id"]: keys | new for r in records for keys, new, _ in r.decoded_mods()}
    for before in backfilled:
        after = streamed[before["id"] + 100]
        for name, value in before.items():
            if name != "id":
                assert same(after[name], value), (name, after[name], value)
    full = next(r for r in backfilled if r["id"] == 1)
    assert full["n"] == Decimal("123456789.125")
    assert full["nu"] == "123456789012345678901234567890.123456789"  # exact, as text
    assert math.isnan(full["f4"]) and full["f8"] == math.inf
    assert full["t"] == "héllo ✓" and full["c"] == "ab   " and full["b"] is True
    assert full["d"] == date(2026, 2, 28) and full["tm"] == "13:45:01.5"
    assert full["ts"] == datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
    assert full["tz"] == datetime(2026, 3, 1, 17, 0, tzinfo=UTC)  # New York noon
    assert full["j"] == {"a": None, "b": [1, 2]} and full["jb"] == {"z": 1.5}
    assert full["by"] == b"\x00\xff\x10" and full["e"] == "sad"
    assert full["ai"] == [1, None, 3] and full["at"] == ["a,b", None, 'q"uote']
    empty = next(r for r in backfilled if r["id"] == 2)
    assert empty["f4"] == -math.inf and math.isnan(empty["f8"]) and empty["ai"] == []
