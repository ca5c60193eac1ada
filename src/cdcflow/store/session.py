"""A per-thread SQLite connection with the catalog and partition ranges it has cached."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Any

from cdcflow.store import partition_map
from cdcflow.store.capture import PartitionRanges
from cdcflow.store.catalog import Catalog, load_catalog
from cdcflow.store.sqlite import connect, read_meta


@dataclass(slots=True)
class Session:
    """One connection; `refresh` (inside a transaction) reloads what other processes changed."""

    conn: sqlite3.Connection
    catalog: Catalog
    partition_version: int
    ranges: dict[str, PartitionRanges]
    meta: dict[str, Any]
    policy_checked: dict[str, int] = field(default_factory=dict)
    objects: dict[str, str] = field(default_factory=dict)
    """Column types (JSON) of the external objects this session has recorded."""
    object_types: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    """The column-types tuple last recorded per object (checked by identity: no JSON)."""

    def forget_objects(self) -> None:
        """After a rollback: what was recorded may not be in the log."""
        self.objects.clear()
        self.object_types.clear()

    @staticmethod
    def open(path: str) -> Session:
        conn = connect(path)
        return Session(conn, Catalog(-1, {}, {}), -1, {}, {})

    def refresh(self) -> Catalog:
        """Reload the catalog and partition ranges if their versions moved. Call inside a txn."""
        meta = read_meta(self.conn)
        self.meta = meta
        schema_version = int(meta["schema_version"])
        if schema_version != self.catalog.version:
            self.catalog = load_catalog(self.conn, schema_version)
            self.partition_version = -1
        if int(meta["partition_version"]) != self.partition_version:
            self.ranges = {}
            self.partition_version = int(meta["partition_version"])
        return self.catalog

    def ranges_of(self, stream: str) -> PartitionRanges:
        """Active partition ranges of a stream, as of the last `refresh`."""
        if stream not in self.ranges:
            active = partition_map.active_partitions(self.conn, stream)
            self.ranges[stream] = PartitionRanges(
                tuple(p.key_range.start for p in active), tuple(p.token for p in active)
            )
        return self.ranges[stream]
