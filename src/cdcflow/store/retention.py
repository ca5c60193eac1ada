"""Retention: change records older than a stream's retention period, and row versions older
than the version-retention period, are removed. Reads of removed ranges are OutOfRange errors.
A snapshot pin (a backfill's snapshot) keeps the row versions it reads until it is released.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from cdcflow.store import log
from cdcflow.store.catalog import Catalog
from cdcflow.store.rows import gc_versions, next_versions
from cdcflow.store.sqlite import read_meta, write_meta

VERSION_RETENTION_MICROS = 3_600 * 1_000_000
"""Row versions stay readable (scan/read_row at a timestamp) for one hour."""
GC_MIN_VERSIONS = 20_000
"""A writer's round of garbage collection looks at this many row versions at least (about
20 ms here), on from where the last round stopped, so that its time does not grow with the
tables (all of a million-row table's versions took about a second, every 10 s)."""
GC_VERSIONS_PER_WRITE = 4
"""...and at this many for each version written since the last round, so that a pass over
all versions keeps up with the writes: at most a quarter of the versions are then garbage
waiting for the pass to come round to them (about 4 us per version written)."""


def expire_change_records(conn: sqlite3.Connection, catalog: Catalog, now_micros: int) -> int:
    """Delete every stream's records older than its retention; return how many went."""
    return sum(
        log.expire_records(conn, stream.name, now_micros - stream.retention_micros)
        for stream in catalog.streams.values()
    )


def snapshot_pins(meta: dict[str, Any]) -> dict[str, int]:
    """Pinned snapshot times by name (read from the `_meta` values)."""
    pins: dict[str, int] = json.loads(meta.get("snapshot_pins") or "{}")
    return pins


def version_cutoff(meta: dict[str, Any], now_micros: int) -> int:
    """Row versions superseded before this stay removable: the version retention, held back
    by the oldest pinned snapshot."""
    return min([now_micros - VERSION_RETENTION_MICROS, *snapshot_pins(meta).values()])


def expire_row_versions(conn: sqlite3.Connection, catalog: Catalog, now_micros: int,
                        budget: int | None = None) -> int:
    """Remove the row versions superseded before the cutoff, and the tombstones older than
    it; return how many went. All of them; or, with `budget`, those among the next `budget`
    versions in (table, key) order after where the last round stopped (`gc_cursor` in meta),
    starting over after the last table."""
    meta = read_meta(conn)
    cutoff = version_cutoff(meta, now_micros)
    storages = sorted(storage for _, storage in catalog.tables.values())
    if budget is None:
        return sum(gc_versions(conn, storage, cutoff) for storage in storages)
    cursor: list[str] | None = json.loads(meta.get("gc_cursor") or "null")
    removed, left = 0, budget
    for storage in (s for s in storages if cursor is None or s >= cursor[0]):
        after = cursor[1] if cursor is not None and storage == cursor[0] else None
        if left <= 0:  # the budget ended with the table before: this one's turn is next
            write_meta(conn, {"gc_cursor": json.dumps([storage, ""])})
            return removed
        last, counted = next_versions(conn, storage, after, left)
        removed += gc_versions(conn, storage, cutoff, after, last)
        left -= counted
        if last is not None:  # the budget ends in this table
            write_meta(conn, {"gc_cursor": json.dumps([storage, last])})
            return removed
    write_meta(conn, {"gc_cursor": "null"})  # past the last table: the next round starts over
    return removed
