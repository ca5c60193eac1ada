"""The watcher's view of an embedded database: its tables as objects, its safe time, and
polls through the table's (shard, commit timestamp) index, or a scan where it has none.

Horizon rule: the safe time, closed up to now. Commit timestamps are assigned inside the
write lock after every closed time, so no commit can still come at or below it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cdcflow.capture.embedded import source_object
from cdcflow.capture.source import SourceObject
from cdcflow.capture.watcher.config import Page, Polled, WatchedTable
from cdcflow.clock import SYSTEM_CLOCK
from cdcflow.errors import InvalidArgument
from cdcflow.model.timestamps import from_micros, to_micros
from cdcflow.store.database import Database
from cdcflow.store.indexes import PolledRow

PAST_EVERY_KEY = "\U0010ffff"
"""A cursor key after every encoded key: the snapshot holds every row of its timestamp."""


class EmbeddedTarget:
    def __init__(self, path: str) -> None:
        self.database = Database.open(path, create=False)
        self.source_id = f"watcher:embedded:{path}"

    def objects(self, tables: tuple[WatchedTable, ...]) -> list[SourceObject]:
        """The watched tables, each checked: its commit-timestamp column is a TIMESTAMP and
        its shard column, when it has one, an INT64."""
        found = []
        self.database.tables()  # reloads the schema another process may have changed
        for table in tables:
            schema = self.database.table_schema(table.name)
            stamp = schema.column(table.commit_timestamp_column)
            if stamp.type.code != "TIMESTAMP":
                raise InvalidArgument(f"table {table.name!r}: commit_timestamp_column "
                                      f"{stamp.name!r} is {stamp.type.code}, not a TIMESTAMP")
            if table.shard_column is not None and \
                    schema.column(table.shard_column).type.code != "INT64":
                raise InvalidArgument(f"table {table.name!r}: shard_column "
                                      f"{table.shard_column!r} must be an INT64")
            if table.soft_delete_column is not None and \
                    schema.column(table.soft_delete_column).type.code != "BOOL":
                raise InvalidArgument(f"table {table.name!r}: soft_delete_column "
                                      f"{table.soft_delete_column!r} must be a BOOL")
            if table.deletes_table is not None:
                raise InvalidArgument(f"table {table.name!r}: deletes_table is for PostgreSQL "
                                      "targets; use soft_delete_column here")
            found.append(source_object(schema))
        return found

    def horizon(self) -> int:
        """The safe time (micros), closed up to now first. The commit-timestamp column must
        be written with COMMIT_TIMESTAMP."""
        return to_micros(self.database.close_until(SYSTEM_CLOCK.now()))

    def start_cursor(self, horizon: int) -> Any:
        return [horizon, PAST_EVERY_KEY]

    def pin(self, source_id: str, micros: int) -> None:
        self.database.pin_snapshot(source_id, from_micros(micros))

    def release(self, source_id: str) -> None:
        self.database.release_snapshot(source_id)

    def index_for(self, table: WatchedTable) -> str | None:
        wanted = (table.shard_column, table.commit_timestamp_column) if table.shard_column \
            else (table.commit_timestamp_column,)
        return next((i.name for i in self.database.indexes()
                     if i.table == table.name and i.columns == wanted), None)

    def poll(self, table: WatchedTable, cursor: Any, up_to: int, limit: int,
             since: int | None = None) -> Page:
        """Rows with (commit timestamp, key) after the cursor and timestamp <= `up_to`, in
        that order, at most `limit`; restricted to the table's shard values. With `since`
        (the previous round's horizon), each counts its versions committed after it."""
        after = (from_micros(cursor[0]), cursor[1])
        index = self.index_for(table)
        if index is not None:
            prefix = [list(table.shard_values or ())] if table.shard_column else []
            found = self.database.poll_index(index, prefix, after=after,
                                             up_to=from_micros(up_to), limit=limit)
        else:
            found = self._scan(table, after, from_micros(up_to), limit)
        counts = {} if since is None or not found else self.database.count_versions(
            table.name, [r.key for r in found], from_micros(since), from_micros(up_to))
        rows = [Polled(to_micros(r.cursor), r.key, r.row, versions=counts.get(r.key))
                for r in found]
        return Page(rows, [rows[-1].micros, rows[-1].key] if rows else cursor,
                    len(rows) >= limit)

    def _scan(self, table: WatchedTable, after: tuple[Any, str], up_to: Any,
              limit: int) -> list[PolledRow]:
        schema = self.database.table_schema(table.name)
        column, shards = table.commit_timestamp_column, set(table.shard_values or ())
        found = []
        for row in self.database.scan(table.name):
            stamp = row.get(column)
            if stamp is None or stamp > up_to or (table.shard_column is not None and
                                                  row.get(table.shard_column) not in shards):
                continue
            key = schema.encode_key(schema.key_of(row))
            if (stamp, key) > after:
                found.append(PolledRow(stamp, key, row))
        found.sort(key=lambda polled: (polled.cursor, polled.key))
        return found[:limit]

    def encode(self, item: SourceObject, row: dict[str, Any]) -> dict[str, Any]:
        return item.encoded(row)

    def backfill_chunks(self, item: SourceObject, micros: int, after: Any,
                        chunk_rows: int) -> Iterator[tuple[list[dict[str, Any]], Any]]:
        """The rows as of `micros`, in encoded-key order, after the key `after`."""
        schema = self.database.table_schema(item.name)
        keyed = sorted((schema.encode_key(schema.key_of(r)), r) for r in self.database.scan(
            item.name, read_timestamp=from_micros(micros)))
        keyed = [pair for pair in keyed if after is None or pair[0] > after]
        names = [c.name for c in item.columns]
        for start in range(0, len(keyed), chunk_rows):
            chunk = keyed[start:start + chunk_rows]
            yield [{n: r.get(n) for n in names} for _, r in chunk], chunk[-1][0]

    def clean(self, table: WatchedTable, cutoff: int, batch_rows: int) -> int:
        """CW-6: a partitioned update sets the commit timestamp of rows older than `cutoff`
        to NULL; returns how many rows it changed."""
        column = table.commit_timestamp_column
        return self.database.partitioned_update(table.name, {column: None}, column,
                                                from_micros(cutoff), batch_rows)

    def close(self) -> None:
        self.database.close()
