"""The three sides `cdcflow verify` reads, each as canonical rows (`compare.Canonical`):

- a source's object: the embedded database at a read timestamp, by key-hash ranges;
  PostgreSQL in one REPEATABLE READ transaction and MySQL in one consistent snapshot, by
  key chunks; a watcher's target the same way;
- a CDC table's applied rows, one key range's file at a time;
- the events of event files rebuilt into rows: deduplicated by uuid, per key the last
  change by `sort_keys` (gone if it deletes the row), or the backfilled row where no change
  follows; one group of key buckets per pass over the files, so memory stays bounded.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from cdcflow.capture.embedded import EmbeddedSource as EmbeddedChangeSource
from cdcflow.capture.mysql.catalog import read_tables as mysql_tables
from cdcflow.capture.mysql.connection import connect as mysql_connect
from cdcflow.capture.mysql.snapshot import open_consistent
from cdcflow.capture.mysql.snapshot import read_chunk as mysql_chunk
from cdcflow.capture.mysql.source import MySqlSource as MySqlChangeSource
from cdcflow.capture.postgres.connection import connect as pg_connect
from cdcflow.capture.postgres.snapshot import read_chunk as pg_chunk
from cdcflow.capture.postgres.source import PostgresSource as PostgresChangeSource
from cdcflow.capture.source import ChangeSource, SourceObject
from cdcflow.capture.watcher.embedded import EmbeddedTarget
from cdcflow.capture.watcher.source import WatcherSource as WatcherChangeSource
from cdcflow.errors import InvalidArgument
from cdcflow.events.avro_format import read_avro
from cdcflow.events.files import EventFileWriter, check_count, named_bytes
from cdcflow.model.schema import KEY_HASH_SPACE
from cdcflow.model.source import is_backfill
from cdcflow.model.types import decode_value
from cdcflow.store.database import Database
from cdcflow.streams.compare import BUCKETS, Canonical, Canonicalizer, bucket_of
from cdcflow.table import CdcTable

CHUNK_ROWS = 10_000
HASH_RANGES = 16


def source_rows(source: ChangeSource, item: SourceObject, canon: Canonicalizer,
                at: datetime | None) -> Iterator[Canonical]:
    """The object's rows now (or, on the embedded database, at `at`)."""
    match source:
        case EmbeddedChangeSource():
            yield from _embedded(source.database, item.name, canon, at)
        case PostgresChangeSource():
            conn = pg_connect(source.config.dsn, source.config.password_env)
            try:
                yield from _postgres(conn, item, canon)
            finally:
                conn.close()
        case MySqlChangeSource():
            yield from _mysql(source, item, canon)
        case WatcherChangeSource():
            target = source.target
            if isinstance(target, EmbeddedTarget):
                yield from _embedded(target.database, item.name, canon, None)
            else:
                yield from _postgres(target.conn, item, canon)
        case _:
            raise InvalidArgument(f"verify cannot read a {type(source).__name__}")


def _embedded(database: Database, table: str, canon: Canonicalizer,
              at: datetime | None) -> Iterator[Canonical]:
    bounds = [KEY_HASH_SPACE * i // HASH_RANGES for i in range(HASH_RANGES + 1)]
    for start, end in itertools.pairwise(bounds):
        for row in database.scan(table, read_timestamp=at, key_hash_range=(start, end)):
            yield canon.of_values(row)


def _postgres(conn: Any, item: SourceObject, canon: Canonicalizer) -> Iterator[Canonical]:
    """Key chunks inside one REPEATABLE READ transaction: one consistent state."""
    autocommit = conn.autocommit
    conn.autocommit = False
    try:
        with conn.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        after, full = None, True
        while full:
            rows, after, full = pg_chunk(conn, item, after, None, CHUNK_ROWS)
            for row in rows:
                yield canon.of_values({c.name: decode_value(row[c.name], c.type)
                                       for c in item.columns})
    finally:
        conn.rollback()
        conn.autocommit = autocommit


def _mysql(source: MySqlChangeSource, item: SourceObject,
           canon: Canonicalizer) -> Iterator[Canonical]:
    endpoint = source.config.endpoint
    catalog = mysql_connect(endpoint)
    try:
        tables = {t.object_name: t for t in mysql_tables(catalog, source.config.databases)}
    finally:
        catalog.close()
    conn, _ = open_consistent(endpoint, source.mariadb)
    try:
        after, full = None, True
        while full:
            rows, after, full = mysql_chunk(conn, tables[item.name], item, after, CHUNK_ROWS)
            yield from (canon.of_values(row) for row in rows)
    finally:
        conn.rollback()
        conn.close()


def table_rows(table: CdcTable, canon: Canonicalizer) -> Iterator[Canonical]:
    for part in table.applied_parts():
        for row in part.to_pylist():
            yield canon.of_values(row)


class EventRows:
    """The rows an object's events rebuild (module docstring)."""

    def __init__(self, root: str, stream: str, fmt: str, item: SourceObject,
                 canon: Canonicalizer, groups: int) -> None:
        self.files = [part for part in EventFileWriter(root, stream, fmt).committed_parts()
                      if _holds(part.path, item.name)]
        self.fmt, self.item, self.canon = fmt, item, canon
        self.groups = max(1, groups)
        self.events = 0
        self.duplicate_uuids = 0

    def __call__(self) -> Iterator[Canonical]:
        self.events = self.duplicate_uuids = 0
        for group in range(self.groups):
            yield from self._group(group)

    def _group(self, group: int) -> Iterator[Canonical]:
        changed: dict[str, tuple[tuple[Any, ...], bool, str]] = {}
        backfilled: dict[str, tuple[str, str]] = {}
        uuids: set[str] = set()
        for uuid, read_method, order, deleted, read_at, (key, row) in self._events():
            if bucket_of(key) % self.groups != group:
                continue
            self.events += 1
            if uuid in uuids:
                self.duplicate_uuids += 1
                continue
            uuids.add(uuid)
            if is_backfill(read_method):
                if key not in backfilled or backfilled[key][0] <= read_at:
                    backfilled[key] = (read_at, row)
            elif key not in changed or changed[key][0] <= order:
                changed[key] = (order, deleted, row)
        for key, (_, row) in backfilled.items():
            if key not in changed:
                yield key, row
        for key, (_, deleted, row) in changed.items():
            if not deleted:
                yield key, row

    def _events(self) -> Iterator[tuple[str, str, tuple[Any, ...], bool, str, Canonical]]:
        """(uuid, read method, sort keys, deleted, read time, canonical row) of each event
        of the object, file by file."""
        for part in self.files:
            if self.fmt == "json":
                for e in part.json_events():
                    if e["object"] == self.item.name:
                        yield (e["uuid"], e["read_method"], _order(e["sort_keys"]),
                               bool(e["source_metadata"].get("is_deleted")),
                               str(e["read_timestamp"]), self.canon.of_json(e["payload"]))
            else:
                events = list(read_avro(named_bytes(part.path, part.read_bytes())))
                check_count(part.path, len(events), part.events)
                for event in events:
                    if event.object == self.item.name:
                        yield (event.uuid, event.read_method, _order(event.sort_keys),
                               bool(event.source_metadata.get("is_deleted")),
                               event.read_timestamp.isoformat(),
                               self.canon.of_values(event.payload))


def _holds(path: Path, object_name: str) -> bool:
    """Whether a committed file lies under the object's folder (root/stream/object/...)."""
    return object_name in path.parts


def _order(sort_keys: Any) -> tuple[Any, ...]:
    return tuple(json.dumps(k) if isinstance(k, list | dict) else k for k in sort_keys)


def groups_for(rows: int) -> int:
    """Passes over the event files that keep at most about 250,000 keys in memory each."""
    return min(BUCKETS, max(1, -(-rows // 250_000)))
