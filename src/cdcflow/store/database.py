"""`Database`: the embedded database with native change streams, on one SQLite file.

Many processes may open the same file at once, as writers and readers. See the README for the
model: versioned rows, change records written in the commit's own SQLite transaction (CS-1),
partitions over a key hash that split and merge (CS-2), and the READ_<stream> query (CS-5).
The change log and its readers are `ChangeLog`'s; this class adds tables, DDL and commits.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from cdcflow.errors import InvalidArgument, OutOfRange
from cdcflow.model.schema import TableSchema, key_hash
from cdcflow.model.timestamps import as_datetime, format_rfc3339, from_micros, to_micros
from cdcflow.store import catalog as catalog_ops
from cdcflow.store import indexes, journal, partitioned, retention, rows
from cdcflow.store.changelog import ChangeLog
from cdcflow.store.commit import commit_mutations
from cdcflow.store.ddl import parse_ddl, statement_texts
from cdcflow.store.indexes import IndexDef, PolledRow
from cdcflow.store.mutations import Mutation
from cdcflow.store.sqlite import read_meta, read_transaction, write_meta, write_transaction
from cdcflow.store.transaction import Transaction


class Database(ChangeLog):
    """An embedded database file with change streams; open it with `Database.open(path)`."""

    # ---- schema -------------------------------------------------------------------------

    def ddl(self, statements: str | list[str]) -> None:
        """Apply DDL statements, each atomically; a bad statement raises and changes nothing."""
        for text in statement_texts(statements):
            statement = parse_ddl(text)
            session = self._session()
            with write_transaction(session.conn):
                catalog = session.refresh()
                journal.settle(session, catalog)  # its commits render with the old catalog
                catalog_ops.apply_statement(
                    session.conn,
                    catalog,
                    statement,
                    self._now_micros(),
                    self.initial_partition_count,
                )
            self._catalog()  # this session's cached schema is now out of date: reload it

    def table_schema(self, table: str) -> TableSchema:
        cached = self._session().catalog
        if table in cached.tables:
            return cached.tables[table][0]
        return self._catalog().table(table)

    def tables(self) -> list[str]:
        return sorted(self._catalog().tables)

    # ---- writes -------------------------------------------------------------------------

    def transaction(self) -> Transaction:
        return Transaction(self)

    def _commit(self, mutations: list[Mutation]) -> datetime:
        return from_micros(commit_mutations(self._session(), mutations, self._now_micros()))

    # ---- reads --------------------------------------------------------------------------

    def _normalise_key(self, schema: TableSchema, key: Any) -> tuple[Any, ...]:
        if isinstance(key, dict):
            return tuple(key[name] for name in schema.primary_key)
        values = tuple(key) if isinstance(key, tuple | list) else (key,)
        if len(values) != len(schema.primary_key):
            raise InvalidArgument(
                f"key {key!r} has {len(values)} parts; table {schema.name!r} has primary key "
                f"{list(schema.primary_key)}"
            )
        return values

    def read_row(
        self, table: str, key: Any, read_timestamp: datetime | str | None = None
    ) -> dict[str, Any] | None:
        """The row with primary key `key` (a value, tuple or dict), or None if absent."""
        session = self._session()
        at = self._read_micros(read_timestamp)
        with read_transaction(session.conn):
            catalog = session.refresh()
            schema = catalog.table(table)
            encoded_key = schema.encode_key(self._normalise_key(schema, key))
            found = rows.latest_version(session.conn, catalog.storage(table), encoded_key, at)
        return None if found is None else rows.decode_row(schema, found)

    def scan(
        self,
        table: str,
        read_timestamp: datetime | str | None = None,
        key_hash_range: tuple[int, int] | None = None,
    ) -> list[dict[str, Any]]:
        """Every live row at `read_timestamp` (default: now), in one consistent snapshot.

        `key_hash_range` restricts the scan to [start, end) of the partition hash space, so
        parallel readers can split a table and still see the same snapshot.
        """
        session = self._session()
        at = self._read_micros(read_timestamp)
        with read_transaction(session.conn):
            catalog = session.refresh()
            schema = catalog.table(table)
            at = at if at is not None else int(session.meta["last_commit_micros"])
            start, end = key_hash_range if key_hash_range else (0, None)
            found = list(rows.scan_versions(session.conn, catalog.storage(table), at, start, end))
        return [rows.decode_row(schema, r) for r in found]

    def _read_micros(self, read_timestamp: datetime | str | None) -> int | None:
        """Validate a read timestamp and make it safe: close it so no commit can land at or
        before it after the read starts."""
        if read_timestamp is None:
            return None
        micros = to_micros(as_datetime(read_timestamp))
        now = self._now_micros()
        if micros > now:
            raise InvalidArgument(
                f"read_timestamp {format_rfc3339(micros)} is in the future (now is "
                f"{format_rfc3339(now)})"
            )
        session = self._session()
        with read_transaction(session.conn):
            meta = read_meta(session.conn)
        earliest = retention.version_cutoff(meta, now)
        if micros < earliest:
            raise OutOfRange(
                f"read_timestamp {format_rfc3339(micros)} is older than the version retention "
                f"of 1 hour; the earliest valid timestamp is {format_rfc3339(earliest)}"
            )
        self._publish_closed(micros)
        return micros

    def pin_snapshot(self, name: str, at: datetime) -> None:
        """Keep the row versions a read at `at` sees until `release_snapshot(name)`, beyond
        the hour of version retention (a backfill that resumes reads its snapshot again)."""
        micros = to_micros(at)
        now = self._now_micros()
        session = self._session()
        with write_transaction(session.conn):
            meta = read_meta(session.conn)
            if micros < retention.version_cutoff(meta, now):
                raise OutOfRange(
                    f"snapshot {format_rfc3339(micros)} is older than the version retention of "
                    f"1 hour and not pinned; its row versions may be gone")
            pins = retention.snapshot_pins(meta) | {name: micros}
            write_meta(session.conn, {"snapshot_pins": json.dumps(pins)})

    def release_snapshot(self, name: str) -> None:
        session = self._session()
        with write_transaction(session.conn):
            pins = retention.snapshot_pins(read_meta(session.conn))
            pins.pop(name, None)
            write_meta(session.conn, {"snapshot_pins": json.dumps(pins)})

    def indexes(self) -> list[IndexDef]:
        """The secondary indexes, by name."""
        session = self._session()
        with read_transaction(session.conn):
            catalog = session.refresh()
        return sorted(catalog.indexes.values(), key=lambda index: index.name)

    def poll_index(self, index: str, prefix: Sequence[Sequence[Any]] = (),
                   after: tuple[Any, str] | None = None, up_to: Any = None,
                   limit: int = 1000) -> list[PolledRow]:
        """Rows through `index`, newest versions, in one consistent read: `prefix[i]` lists
        the values the i-th index column may take (`ShardId IN (...)`); the next, last
        index column is the cursor, read after `after` = (value, key) and up to `up_to`,
        in (value, key) order, at most `limit` rows (see `cdcflow.store.indexes`)."""
        session = self._session()
        with read_transaction(session.conn):
            catalog = session.refresh()
            found = catalog.index(index)
            return indexes.poll(session.conn, found, catalog.table(found.table),
                                catalog.storage(found.table), prefix, after, up_to, limit)

    def count_versions(self, table: str, keys: list[str], after: datetime,
                       up_to: datetime) -> dict[str, int]:
        """Versions each encoded key of `table` has committed in (after, up_to], while the
        version retention keeps them (how many changes a polled row stands for)."""
        session = self._session()
        with read_transaction(session.conn):
            storage = session.refresh().storage(table)
            return rows.count_versions(session.conn, storage, keys, to_micros(after),
                                       to_micros(up_to))

    def explain_poll(self, index: str, prefix: Sequence[Sequence[Any]] = (),
                     after: tuple[Any, str] | None = None, up_to: Any = None,
                     limit: int = 1000) -> list[str]:
        """SQLite's query plan of the same poll, one line per step."""
        session = self._session()
        with read_transaction(session.conn):
            catalog = session.refresh()
            return indexes.explain(session.conn, catalog.index(index), prefix, after, up_to,
                                   limit)

    def partitioned_update(self, table: str, values: dict[str, Any], column: str,
                           before: datetime, batch_rows: int = 1_000) -> int:
        """Set `values` on every row whose TIMESTAMP `column` is before `before`, in batches
        of `batch_rows`, each its own transaction (CW-6; see `cdcflow.store.partitioned`
        for the caveat on concurrent writers). Returns how many rows changed."""
        return partitioned.partitioned_update(self, table, values, column, before, batch_rows)

    def key_hash(self, table: str, key: Any) -> int:
        """Position of a row in the partition hash space, e.g. to choose a split point."""
        schema = self.table_schema(table)
        return key_hash(table, schema.encode_key(self._normalise_key(schema, key)))

    def partition_of(self, stream: str, table: str, key: Any) -> str:
        """Token of the active partition of `stream` that holds `key` of `table`."""
        position = self.key_hash(table, key)
        for partition in self.partitions(stream):
            if partition.state == "ACTIVE" and partition.key_range.contains(position):
                return partition.token
        raise AssertionError("active partitions cover the whole hash space")
