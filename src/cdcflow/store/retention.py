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
GC_MAX_VERSIONS = 200_000
"""...and at this many at most (about half a second here). In between, the budget
(`gc_budget` in meta, shared by every writer) doubles after a round that found more than a
quarter of what it looked at to be garbage, so that the passes keep up with the writes, or
that ended GC_PASS_ROUNDS rounds into a pass not yet done (tables growing as fast as the
rounds go through them), and halves after one that did neither."""
GC_PASS_ROUNDS = 30
"""Rounds (of 10 s) a pass over every table may take before its budget grows."""


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


def expire_row_versions(conn: sqlite3.Connection, catalog: Catalog, now_micros: int) -> int:
    """Remove every row version superseded before the cutoff, and the tombstones older than
    it; return how many went."""
    cutoff = version_cutoff(read_meta(conn), now_micros)
    return sum(gc_versions(conn, storage, cutoff)
               for storage in sorted(s for _, s in catalog.tables.values()))


def collect_row_versions(conn: sqlite3.Connection, catalog: Catalog, now_micros: int) -> int:
    """A writer's round: remove what `expire_row_versions` would, among the next versions of
    the budget in (table, key) order after where the last round stopped (`gc_cursor` in
    meta), starting over after the last table; then size the next round's budget."""
    meta = read_meta(conn)
    budget = max(int(meta.get("gc_budget") or GC_MIN_VERSIONS), 1)
    removed, looked, done = _collect_some(conn, catalog, version_cutoff(meta, now_micros),
                                          budget, json.loads(meta.get("gc_cursor") or "null"))
    rounds = 0 if done else int(meta.get("gc_pass_rounds") or 0) + 1  # into this pass
    busy = removed * 4 > looked or rounds > GC_PASS_ROUNDS
    write_meta(conn, {"gc_budget": min(budget * 2, GC_MAX_VERSIONS) if busy
                      else max(budget // 2, GC_MIN_VERSIONS), "gc_pass_rounds": rounds})
    return removed


def _collect_some(conn: sqlite3.Connection, catalog: Catalog, cutoff: int, budget: int,
                  cursor: list[str] | None) -> tuple[int, int, bool]:
    """(versions removed, versions looked at, whether the pass is done) of one round of
    `budget` from `cursor`."""
    storages = sorted(storage for _, storage in catalog.tables.values())
    removed, left = 0, budget
    for storage in (s for s in storages if cursor is None or s >= cursor[0]):
        after = cursor[1] if cursor is not None and storage == cursor[0] else None
        if left <= 0:  # the budget ended with the table before: this one's turn is next
            write_meta(conn, {"gc_cursor": json.dumps([storage, ""])})
            return removed, budget, False
        last, counted = next_versions(conn, storage, after, left)
        removed += gc_versions(conn, storage, cutoff, after, last)
        left -= counted
        if last is not None:  # the budget ends in this table
            write_meta(conn, {"gc_cursor": json.dumps([storage, last])})
            return removed, budget, False
    write_meta(conn, {"gc_cursor": "null"})  # past the last table: the next round starts over
    return removed, budget - left, True
