"""The polling change watcher on the embedded database (issue 13; seed 001's CW-8).

Measured in one run on throwaway files, with the seed's Singers table (a generated
ShardId, `MOD(FARM_FINGERPRINT(CONCAT(FirstName, LastName)), 19)`):
  1. Detection: a backlog of --rows upserts (100 per commit) is written, then the watcher
     reads it into its change log. Mutations detected per second, for three layouts: the
     seed's NULL_FILTERED (ShardId, LastModified) index polled with ShardId IN (-18..18);
     an index on LastModified alone; no index (a scan per poll). Baseline: the writer's own
     rate on the same file (mutations committed per second), and the seed's reference of
     3,000-5,000/s per table (CW-8). Goal: >= 10,000/s.
  2. Poll latency at a steady --rate writes/s (20 rows per commit) for --seconds: from each
     row's commit timestamp to its transaction's append to the watcher's log; p50 and p99.
  3. Index size after --index-rows inserts: entries and bytes of the null-filtered index,
     without and with a cleanup of the rows older than the last 10%.
Usage: python bench/bench_watcher.py [--rows 100000] [--rate 2000] [--seconds 20]
       [--index-rows 1000000]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from cdcflow import COMMIT_TIMESTAMP, Database
from cdcflow.capture.watcher.config import EmbeddedTargetConfig, WatchedTable, WatcherConfig
from cdcflow.capture.watcher.source import Poller, WatcherSource
from cdcflow.follow import follow_change_stream
from cdcflow.model.timestamps import to_micros
from cdcflow.store.changelog import ChangeLog

SINGERS = (
    "CREATE TABLE Singers (SingerId INT64 NOT NULL, FirstName STRING(MAX), "
    "LastName STRING(MAX), LastModified TIMESTAMP OPTIONS (allow_commit_timestamp = true), "
    "ShardId INT64 AS (MOD(FARM_FINGERPRINT(CONCAT(FirstName, LastName)), 19)) STORED"
    ") PRIMARY KEY (SingerId)")
LAYOUTS = {
    "shard index": ("CREATE NULL_FILTERED INDEX ByShard ON Singers (ShardId, LastModified)",
                    "ShardId"),
    "timestamp index": ("CREATE INDEX ByTime ON Singers (LastModified)", None),
    "no index": (None, None),
}


def upsert(database: Database, first: int, count: int) -> None:
    with database.transaction() as tx:
        for number in range(first, first + count):
            tx.insert_or_update("Singers", {"SingerId": number, "FirstName": f"f{number}",
                                            "LastName": f"l{number % 977}",
                                            "LastModified": COMMIT_TIMESTAMP})


def watcher_on(folder: Path, database: Database, shard: str | None) -> WatcherSource:
    table = WatchedTable("Singers", "LastModified", shard,
                         tuple(range(-18, 19)) if shard else None)
    return WatcherSource(WatcherConfig(EmbeddedTargetConfig(database.path), (table,),
                                       str(folder / "log.db"), page_rows=5_000))


def detection(folder: Path, rows: int, layout: str) -> tuple[float, float]:
    """(mutations written per second, mutations detected per second)."""
    database = Database.open(str(folder / "shop.db"))
    index, shard = LAYOUTS[layout]
    database.ddl([SINGERS] if index is None else [SINGERS, index])
    source = watcher_on(folder, database, shard)
    source.release(source.snapshot(source.discover(), None))
    began = time.perf_counter()
    for first in range(0, rows, 100):
        upsert(database, first, 100)
    written = rows / (time.perf_counter() - began)
    detected = detection_rate(source, rows)
    source.close()
    database.close()
    return written, detected


def detection_rate(source: WatcherSource, rows: int) -> float:
    """Rows per second the watcher's polls append to its log, until `rows` are in."""
    log = ChangeLog.open(source.log_location()[0])
    source.objects()
    poller = Poller(source, log, log.position(source.source_id).position)  # type: ignore
    began = time.perf_counter()
    seen = 0
    while seen < rows:
        found, _ = poller.round()
        seen += found
    return rows / (time.perf_counter() - began)


def append_lags(log: ChangeLog, cdc_start: Any) -> list[float]:
    """Seconds from each logged transaction's source timestamp to its append."""
    records = follow_change_stream(log, "changes", cdc_start, log.current_timestamp()).records
    return [(to_micros(r.commit_timestamp) - to_micros(r.source_metadata.source_timestamp))
            / 1e6 for r in records]


def steady_latency(folder: Path, rate: int, seconds: float) -> list[float]:
    """Seconds from commit to the watcher's append, per transaction, at `rate` rows/s."""
    database = Database.open(str(folder / "shop.db"))
    database.ddl([SINGERS, LAYOUTS["shard index"][0]])
    source = watcher_on(folder, database, "ShardId")
    snapshot = source.snapshot(source.discover(), None)
    source.release(snapshot)
    log = ChangeLog.open(source.log_location()[0])
    stop = threading.Event()
    capture = threading.Thread(target=source.capture, args=(log, stop))
    capture.start()
    began, number = time.perf_counter(), 0
    while time.perf_counter() - began < seconds:
        upsert(database, number % 50_000, 20)
        number += 20
        pause = began + number / rate - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    mark = source.mark()
    while not source.reached(log, mark):
        time.sleep(0.01)
    stop.set()
    capture.join()
    lags = append_lags(log, snapshot.cdc_start)
    source.close()
    database.close()
    return lags


def index_size(folder: Path, rows: int) -> dict[str, Any]:
    database = Database.open(str(folder / "shop.db"))
    database.ddl([SINGERS, LAYOUTS["shard index"][0]])
    for first in range(0, rows, 1_000):
        upsert(database, first, 1_000)
        if first == rows * 9 // 10 // 1_000 * 1_000:
            cutoff = database.current_timestamp() + timedelta(microseconds=1)
    before = _index_bytes(database.path)
    cleaned = database.partitioned_update("Singers", {"LastModified": None}, "LastModified",
                                          cutoff, batch_rows=10_000)
    database.close()
    return {"rows": rows, "before": before, "cleaned_rows": cleaned,
            "after": _index_bytes(database.path)}


def _index_bytes(path: str) -> dict[str, int]:
    conn = sqlite3.connect(path)
    (storage,) = conn.execute("SELECT storage FROM _indexes").fetchone()
    (entries,) = conn.execute(f"SELECT count(*) FROM {storage}").fetchone()
    try:
        (size,) = conn.execute("SELECT sum(pgsize) FROM dbstat WHERE name LIKE ?",
                               (f"{storage}%",)).fetchone()
    except sqlite3.OperationalError:  # SQLite built without dbstat
        size = -1
    conn.close()
    return {"entries": int(entries), "bytes": int(size or 0)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rate", type=int, default=2_000)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--index-rows", type=int, default=1_000_000)
    args = parser.parse_args()
    print(f"1. detection of a backlog of {args.rows:,} upserts (seed's reference 3,000-5,000/s "
          "per table; goal >= 10,000/s)")
    for layout in LAYOUTS:
        with tempfile.TemporaryDirectory() as folder:
            written, detected = detection(Path(folder), args.rows, layout)
        print(f"   {layout:16s} detected {detected:9,.0f}/s  written {written:9,.0f}/s  "
              f"ratio detected/written {detected / written:5.2f}  ratio to 5,000/s "
              f"{detected / 5_000:5.2f}")
    with tempfile.TemporaryDirectory() as folder:
        lags = sorted(steady_latency(Path(folder), args.rate, args.seconds))
    print(f"2. latency at {args.rate:,} writes/s for {args.seconds:.0f} s over {len(lags):,} "
          f"transactions: p50 {statistics.median(lags) * 1000:.0f} ms, p99 "
          f"{lags[int(len(lags) * 0.99)] * 1000:.0f} ms")
    with tempfile.TemporaryDirectory() as folder:
        size = index_size(Path(folder), args.index_rows)
    print(f"3. index after {size['rows']:,} inserts: {size['before']['entries']:,} entries, "
          f"{size['before']['bytes'] / 2**20:.1f} MiB; after cleaning "
          f"{size['cleaned_rows']:,} old rows: {size['after']['entries']:,} entries, "
          f"{size['after']['bytes'] / 2**20:.1f} MiB (bytes: pages SQLite has not reused "
          "stay in the file until VACUUM)")


if __name__ == "__main__":
    main()
