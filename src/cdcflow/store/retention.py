"""Retention: change records older than a stream's retention period, and row versions older
than the version-retention period, are removed. Reads of removed ranges are OutOfRange errors.
"""

from __future__ import annotations

import sqlite3

from cdcflow.store import log
from cdcflow.store.catalog import Catalog
from cdcflow.store.rows import gc_versions

VERSION_RETENTION_MICROS = 3_600 * 1_000_000
"""Row versions stay readable (scan/read_row at a timestamp) for one hour."""


def expire_change_records(conn: sqlite3.Connection, catalog: Catalog, now_micros: int) -> int:
    """Delete every stream's records older than its retention; return how many went."""
    return sum(
        log.expire_records(conn, stream.name, now_micros - stream.retention_micros)
        for stream in catalog.streams.values()
    )


def expire_row_versions(conn: sqlite3.Connection, catalog: Catalog, now_micros: int) -> int:
    cutoff = now_micros - VERSION_RETENTION_MICROS
    return sum(gc_versions(conn, storage, cutoff) for _, storage in catalog.tables.values())
