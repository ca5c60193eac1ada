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
from cdcflow.store.rows import gc_versions
from cdcflow.store.sqlite import read_meta

VERSION_RETENTION_MICROS = 3_600 * 1_000_000
"""Row versions stay readable (scan/read_row at a timestamp) for one hour."""


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
    cutoff = version_cutoff(read_meta(conn), now_micros)
    return sum(gc_versions(conn, storage, cutoff) for _, storage in catalog.tables.values())
