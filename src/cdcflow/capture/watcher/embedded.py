"""The watcher's view of an embedded database: its tables as objects, its safe time, and
polls through the table's (shard, commit timestamp) index, or a scan where it has none."""

from __future__ import annotations

from typing import Any

from cdcflow.capture.embedded import source_object
from cdcflow.capture.source import SourceObject
from cdcflow.capture.watcher.config import WatchedTable
from cdcflow.clock import SYSTEM_CLOCK
from cdcflow.errors import InvalidArgument
from cdcflow.model.timestamps import from_micros, to_micros
from cdcflow.store.database import Database
from cdcflow.store.indexes import PolledRow


class EmbeddedTarget:
    def __init__(self, path: str) -> None:
        self.database = Database.open(path, create=False)

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
            found.append(source_object(schema))
        return found

    def horizon(self) -> int:
        """The safe time (micros), closed up to now first: every commit at or before it is
        visible, and no commit can come later with an earlier timestamp, since timestamps
        are assigned inside the write lock after every closed time. The commit-timestamp
        column must be written with COMMIT_TIMESTAMP."""
        return to_micros(self.database.close_until(SYSTEM_CLOCK.now()))

    def index_for(self, table: WatchedTable) -> str | None:
        wanted = (table.shard_column, table.commit_timestamp_column) if table.shard_column \
            else (table.commit_timestamp_column,)
        return next((i.name for i in self.database.indexes()
                     if i.table == table.name and i.columns == wanted), None)

    def poll(self, table: WatchedTable, after: tuple[int, str], up_to: int,
             limit: int) -> list[PolledRow]:
        """Rows with (commit timestamp, key) after `after` and timestamp <= `up_to`, in that
        order, at most `limit`; restricted to the table's shard values."""
        cursor = (from_micros(after[0]), after[1])
        index = self.index_for(table)
        if index is not None:
            prefix = [list(table.shard_values or ())] if table.shard_column else []
            return self.database.poll_index(index, prefix, after=cursor,
                                            up_to=from_micros(up_to), limit=limit)
        return self._scan(table, cursor, from_micros(up_to), limit)

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

    def close(self) -> None:
        self.database.close()
