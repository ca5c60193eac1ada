"""The watcher's view of a PostgreSQL database: schema-qualified tables as objects, a horizon
no running transaction can still write below, and polls by a (timestamp, key) cursor through
the partial (shard, timestamp) index that `pg_schema.prepare_table` creates.

Horizon rule: the commit-timestamp column must hold a time the writing transaction took on
the server no earlier than its own start (`now()`, `clock_timestamp()`, or the trigger that
`prepare_table` installs). Then a running transaction can only still write values at or
after its `xact_start`, so the horizon is the oldest `xact_start` in pg_stat_activity (other
sessions of this database that can write), capped at the server clock minus a small margin
(a transaction takes its start time a moment before it shows there). Seeing other sessions'
`xact_start` needs `pg_read_all_stats`. While a prepared transaction waits, its start time is
unknown, so the horizon holds where it was.

Deletes come from a trigger-fed table, polled by the same horizon and merged in time order;
a delete that a row written back with an earlier time overrides is left out
(`_written_back`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from psycopg2 import sql

from cdcflow.capture.postgres.catalog import TypeCache, read_tables, source_object
from cdcflow.capture.postgres.connection import connect, describe_dsn, typed
from cdcflow.capture.postgres.snapshot import as_output_text
from cdcflow.capture.postgres.types import converter
from cdcflow.capture.source import SourceObject
from cdcflow.capture.watcher.config import Page, Polled, PostgresTargetConfig, WatchedTable
from cdcflow.capture.watcher.pg_schema import clean_table, qualified, split_name
from cdcflow.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from cdcflow.model.timestamps import from_micros
from cdcflow.model.types import decode_value

PAST_EVERY_KEY = "past every key"
MICROS = "(extract(epoch FROM {}) * 1000000)::bigint"
_HORIZON = f"""
SELECT {MICROS.format('clock_timestamp()')},
       (SELECT {MICROS.format('min(xact_start)')} FROM pg_stat_activity
         WHERE pid <> pg_backend_pid() AND datname = current_database()
           AND backend_type NOT IN ('autovacuum worker', 'autovacuum launcher', 'walsender',
                                    'parallel worker', 'checkpointer', 'background writer',
                                    'walwriter', 'archiver', 'startup')),
       (SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database())
"""
_CAN_SEE = "SELECT rolsuper OR pg_has_role(current_user, 'pg_read_all_stats', 'USAGE') " \
           "FROM pg_roles WHERE rolname = current_user"
_COLUMN_TYPES = """
SELECT a.attname, t.typname FROM pg_attribute a
  JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_type t ON t.oid = a.atttypid
 WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
"""
_COLUMN_COUNT = """
SELECT count(*) FROM pg_attribute a
  JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
   AND a.attgenerated = ''
"""
_WANTED_TYPES = {"commit_timestamp_column": ("timestamptz",),
                 "shard_column": ("int2", "int4", "int8"), "soft_delete_column": ("bool",)}


class PostgresTarget:
    def __init__(self, config: PostgresTargetConfig) -> None:
        self.config = config
        self.conn = connect(config.dsn, config.password_env)
        self.source_id = f"watcher:postgres:{describe_dsn(config.dsn)}"
        self._last_horizon: int | None = None
        self._objects: dict[str, SourceObject] = {}
        self._tables: tuple[WatchedTable, ...] = ()
        self._as_text: set[str] = set()
        self.last_query = ""
        """The last query run, as sent (for tests and EXPLAIN)."""
        with self.conn.cursor() as cur:
            cur.execute(_CAN_SEE)
            if not cur.fetchone()[0]:
                raise FailedPrecondition(
                    "the watcher's role cannot see other sessions' transaction start times; "
                    "it needs pg_read_all_stats (GRANT pg_read_all_stats TO the role)")

    def objects(self, tables: tuple[WatchedTable, ...]) -> list[SourceObject]:
        """The watched tables, each checked for its columns' types."""
        known = {t.object_name: t for t in read_tables(self.conn)}
        cache, found = TypeCache(), []
        for table in tables:
            if table.name not in known:
                raise NotFound(f"table {table.name!r} does not exist at "
                               f"{describe_dsn(self.config.dsn)} (name it as schema.table)")
            self._check_columns(table)
            cache.load(self.conn, {c.type_oid for c in known[table.name].columns})
            found.append(source_object(known[table.name], cache))
            if not found[-1].primary_key:
                raise FailedPrecondition(f"table {table.name!r} has no primary key: the "
                                         "watcher's cursor needs one")
        self._objects = {o.name: o for o in found}
        self._tables = tables
        return found

    def _follow_columns(self, table: WatchedTable) -> None:
        """Read the tables again when `table` gained or lost a column since, so that polls
        select it (the poller then sees a new column in the rows and rediscovers)."""
        with self.conn.cursor() as cur:
            cur.execute(_COLUMN_COUNT, split_name(table.name))
            count = int(cur.fetchone()[0])
        if count != len(self._objects[table.name].columns):
            self._as_text.clear()
            self.objects(self._tables)

    def _check_columns(self, table: WatchedTable) -> None:
        with self.conn.cursor() as cur:
            cur.execute(_COLUMN_TYPES, split_name(table.name))
            types = dict(cur.fetchall())
        for option, allowed in _WANTED_TYPES.items():
            column = getattr(table, option)
            if column is not None and types.get(column) not in allowed:
                raise InvalidArgument(
                    f"table {table.name!r}: {option} {column!r} is "
                    f"{types.get(column, 'not a column')}, not {' or '.join(allowed)}")
        if table.deletes_table is not None:
            with self.conn.cursor() as cur:
                cur.execute(_COLUMN_TYPES, split_name(table.deletes_table))
                if "deleted_at" not in dict(cur.fetchall()):
                    raise NotFound(f"table {table.name!r}: deletes_table "
                                   f"{table.deletes_table!r} is not a deletes table (see "
                                   "cdcflow watcher prepare-postgres)")

    def horizon(self) -> int:
        """Micros below which no transaction can still commit a row (module docstring)."""
        with self.conn.cursor() as cur:
            cur.execute(_HORIZON)
            now, oldest, prepared = cur.fetchone()  # text once int8 is read as text
        if int(prepared):
            if self._last_horizon is None:
                raise Unavailable("a prepared transaction is waiting in the database; the "
                                  "watcher takes its first horizon once it is finished")
            return self._last_horizon
        bound = int(now) - int(self.config.horizon_margin_seconds * 1_000_000)
        if oldest is not None:
            bound = min(bound, int(oldest) - 1)
        self._last_horizon = max(bound, self._last_horizon or bound)
        return self._last_horizon

    def start_cursor(self, horizon: int) -> Any:
        return {"rows": [horizon, PAST_EVERY_KEY], "deletes": [horizon, 0]}

    def pin(self, source_id: str, micros: int) -> None:
        """Nothing to pin: the backfill reads the rows at or below the horizon."""

    def release(self, source_id: str) -> None:
        """Nothing pinned."""

    def encode(self, item: SourceObject, row: dict[str, Any]) -> dict[str, Any]:
        return row  # polls read the record encoding already

    def poll(self, table: WatchedTable, cursor: Any, up_to: int, limit: int,
             since: int | None = None) -> Page:
        """Rows and deletes after their cursors, at or below `up_to`, merged in timestamp
        order (a delete before a row of the same time) and cut where a full page ends.
        PostgreSQL keeps no versions to count (`since` is not used)."""
        self._follow_columns(table)
        rows = self._poll_rows(table, cursor["rows"], up_to, limit)
        deletes = [] if table.deletes_table is None else self._poll_deletes(
            table, cursor["deletes"], up_to, limit)
        rows_full, deletes_full = len(rows) >= limit, len(deletes) >= limit
        if deletes_full:
            rows = [r for r in rows if r[0].micros < deletes[-1][0].micros]
        if rows_full and rows:
            deletes = [d for d in deletes if d[0].micros <= rows[-1][0].micros]
        merged = sorted([(p.micros, 0, p) for p, _ in deletes] +
                        [(p.micros, 1, p) for p, _ in rows], key=lambda m: m[:2])
        after = {"rows": rows[-1][1] if rows else cursor["rows"],
                 "deletes": deletes[-1][1] if deletes else cursor.get("deletes")}
        return Page([p for _, _, p in merged], after, rows_full or deletes_full)

    def _poll_rows(self, table: WatchedTable, cursor: list[Any], up_to: int,
                   limit: int) -> list[tuple[Polled, Any]]:
        item = self._objects[table.name]
        stamp = sql.Identifier(table.commit_timestamp_column)
        keys = [sql.Identifier(k) for k in item.primary_key]
        conditions = [sql.SQL("{} <= %s AND {} IS NOT NULL").format(stamp, stamp)]
        if table.shard_column is not None:
            conditions.append(_polled_shards(table, sql.Identifier(table.shard_column)))
        params: list[Any] = [from_micros(up_to)]
        if cursor[1] == PAST_EVERY_KEY:
            conditions.append(sql.SQL("{} > %s").format(stamp))
            params.append(from_micros(cursor[0]))
        else:
            conditions.append(sql.SQL("({}) > ({})").format(
                sql.SQL(", ").join([stamp, *keys]),
                sql.SQL(", ").join(sql.Placeholder() * (len(keys) + 1))))
            params.extend([from_micros(cursor[0]), *cursor[1]])
        found = self._select(item, sql.SQL(" AND ").join(conditions), params,
                             [stamp, *keys], keys, stamp, limit)
        return [(Polled(int(micros or 0), json.dumps(key), row), [micros, key])
                for micros, key, row in found]

    def _poll_deletes(self, table: WatchedTable, cursor: list[Any], up_to: int,
                      limit: int) -> list[tuple[Polled, Any]]:
        item = self._objects[table.name]
        deleted = SourceObject(str(table.deletes_table),
                               tuple(c for c in item.columns if c.key_position))
        stamp, order = sql.Identifier("deleted_at"), sql.Identifier("_cdcflow_id")
        keys = [*(sql.Identifier(k) for k in item.primary_key), order]
        where = sql.SQL("{} <= %s AND ({}, {}) > (%s, %s) AND NOT {}").format(
            stamp, stamp, order, _written_back(table, item.primary_key))
        found = self._select(deleted, where, [from_micros(up_to), from_micros(cursor[0]),
                                              cursor[1]], [stamp, order], keys, stamp, limit)
        return [(Polled(int(micros or 0), json.dumps(key[:-1]), row, deleted=True),
                 [micros, int(key[-1])]) for micros, key, row in found]

    def _select(self, item: SourceObject, where: sql.Composable, params: list[Any],
                order: list[sql.Identifier], keys: list[sql.Identifier],
                stamp: sql.Identifier | None,
                limit: int) -> list[tuple[int | None, list[str], dict[str, Any]]]:
        """(micros of `stamp`, `keys` as text, the row in the record encoding) of up to
        `limit` rows of `item` in `order`."""
        columns = [sql.SQL("{} AS {}").format(sql.Identifier(c.name),
                                              sql.Identifier(f"_cdcflow_{i}"))
                   for i, c in enumerate(item.columns)]
        micros = sql.SQL("NULL") if stamp is None else sql.SQL(MICROS).format(stamp)
        texts = [sql.SQL("{}::text AS {}").format(k, sql.Identifier(f"_cdcflow_key_{i}"))
                 for i, k in enumerate(keys)]  # named apart: ORDER BY prefers output names
        query = sql.SQL("SELECT {} AS _cdcflow_micros, {} FROM {} WHERE {} ORDER BY {} "
                        "LIMIT {}").format(micros, sql.SQL(", ").join(texts + columns),
            qualified(item.name), where, sql.SQL(", ").join(order), sql.Literal(limit))
        try:
            if item.name not in self._as_text:
                as_output_text(self.conn, sql.SQL("SELECT {} FROM {} LIMIT 0").format(
                    sql.SQL(", ").join(columns), qualified(item.name)))
                self._as_text.add(item.name)
            with self.conn.cursor() as cur:
                cur.execute(query, params)
                self.last_query = cur.query.decode()
                fetched = cur.fetchall()
        except Exception as error:
            raise typed(error, f"polling {item.name!r}") from None
        convert = [(c.name, converter(c.type)) for c in item.columns]
        width = len(keys) + 1
        return [(None if row[0] is None else int(row[0]), list(row[1:width]),
                 {name: to_value(text) for (name, to_value), text in
                  zip(convert, row[width:], strict=True)}) for row in fetched]

    def backfill_chunks(self, item: SourceObject, micros: int, after: Any,
                        chunk_rows: int) -> Iterator[tuple[list[dict[str, Any]], Any]]:
        """Rows whose timestamp is NULL or at most `micros` (later ones are polled), in key
        order after the key texts `after`, as Python values; each chunk its own snapshot
        (a row that changes between chunks gets a later timestamp, and is polled)."""
        table = next(t for t in self._tables if t.name == item.name)
        stamp = sql.Identifier(table.commit_timestamp_column)
        keys = [sql.Identifier(k) for k in item.primary_key]
        while True:
            where = sql.SQL("({} IS NULL OR {} <= %s)").format(stamp, stamp)
            params: list[Any] = [from_micros(micros)]
            if after is not None:
                where += sql.SQL(" AND ({}) > ({})").format(
                    sql.SQL(", ").join(keys), sql.SQL(", ").join(sql.Placeholder() * len(keys)))
                params.extend(after)
            found = self._select(item, where, params, keys, keys, None, chunk_rows)
            if not found:
                return
            after = found[-1][1]
            yield [{c.name: decode_value(row[c.name], c.type) for c in item.columns}
                   for _, _, row in found], after

    def clean(self, table: WatchedTable, cutoff: int, batch_rows: int) -> int:
        """CW-6 on PostgreSQL: batches of rows older than `cutoff` get a NULL timestamp (and
        a deletes table loses its entries older than it), each batch its own transaction.
        The rows are locked and checked again before they are changed, so a row a writer
        updates meanwhile keeps its new timestamp; the stamp trigger stands aside."""
        return clean_table(self.conn, table, from_micros(cutoff), batch_rows)

    def close(self) -> None:
        self.conn.close()


def _polled_shards(table: WatchedTable, shard: sql.Composable) -> sql.Composable:
    """The shard condition of every poll (CW-5); NULL while the row is processed (CW-7)."""
    return sql.SQL("{} IS NOT NULL AND {} IN ({})").format(
        shard, shard, sql.SQL(", ").join(map(sql.Literal, table.shard_values or ())))


def _written_back(table: WatchedTable, primary_key: tuple[str, ...]) -> sql.Composable:
    """True for a delete whose key the table holds again, in a row the polls return, with an
    earlier time (or none, once cleaned up).

    In one snapshot a live row and a committed delete of its key mean the row was written
    after the delete. Its time can still be earlier: the stamp is the writing transaction's
    start, and that transaction may have started before the deleting one. Polled in time
    order, the delete would then come last and erase the row, so it is left out: the row's
    own version is the key's last word (several changes between polls arrive as the last).
    The key must match as text too (the events' key), not only by the column's equality
    (citext, numeric scale); a row the polls skip (processed, another shard) keeps the
    delete."""
    deletes, live = qualified(str(table.deletes_table)), sql.Identifier("_cdcflow_live")
    same_key = sql.SQL(" AND ").join(
        sql.SQL("{}.{} = {}.{} AND {}.{}::text = {}.{}::text").format(
            live, sql.Identifier(k), deletes, sql.Identifier(k),
            live, sql.Identifier(k), deletes, sql.Identifier(k))
        for k in primary_key)
    stamp = sql.SQL("{}.{}").format(live, sql.Identifier(table.commit_timestamp_column))
    conditions = [same_key, sql.SQL("({} IS NULL OR {} < {}.{})").format(
        stamp, stamp, deletes, sql.Identifier("deleted_at"))]
    if table.shard_column is not None:
        conditions.append(_polled_shards(table, sql.SQL("{}.{}").format(
            live, sql.Identifier(table.shard_column))))
    return sql.SQL("EXISTS (SELECT 1 FROM {} AS {} WHERE {})").format(
        qualified(table.name), live, sql.SQL(" AND ").join(conditions))
