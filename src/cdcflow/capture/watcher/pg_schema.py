"""Schema helpers that make a PostgreSQL table watchable without changing the applications
that write it (issue 13's second target, seed 001 in PostgreSQL terms):

- a commit-timestamp column kept by a BEFORE INSERT OR UPDATE trigger (`now()`: the writing
  transaction's start, the same for all its rows, which the watcher's horizon relies on);
- optionally a `Processed` boolean that the trigger sets back to false on any update that
  does not set it itself (CW-7);
- optionally a shard column, `GENERATED ALWAYS AS (mod(hashtextextended(key, 0), N)) STORED`
  (CW-3), NULL while the row is processed;
- a partial index on (shard, timestamp) `WHERE shard IS NOT NULL AND timestamp IS NOT NULL`,
  PostgreSQL's null-filtered index (CW-4), or on (timestamp) without shards;
- optionally a deletes table that an AFTER DELETE trigger fills with the deleted rows' keys,
  since polling cannot see a hard delete.

Adding a stored generated column rewrites the table under an exclusive lock. Every name is
quoted; function bodies are passed as string literals.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg2 import sql

from cdcflow.capture.postgres.connection import typed
from cdcflow.capture.watcher.config import WatchedTable
from cdcflow.errors import CdcflowError, InvalidArgument, NotFound

CLEANUP_SETTING = "cdcflow.watcher_cleanup"
"""Set to `on` in a transaction, it makes the stamp trigger stand aside (for cleanup)."""
_TABLE = "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace " \
         "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')"
_KEY = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod)
  FROM pg_index i, unnest(i.indkey) WITH ORDINALITY AS k(num, position), pg_attribute a
 WHERE i.indrelid = %s AND i.indisprimary AND a.attrelid = i.indrelid AND a.attnum = k.num
 ORDER BY k.position
"""


def split_name(name: str) -> tuple[str, str]:
    """`schema.table` (the first dot splits) as its two parts."""
    if "." not in name:
        raise InvalidArgument(f"table {name!r}: name PostgreSQL tables as schema.table")
    schema, table = name.split(".", 1)
    return schema, table


def qualified(name: str) -> sql.Composable:
    schema, table = split_name(name)
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table))


def prepare_table(conn: Any, table: str, timestamp_column: str, *,
                  shard_column: str | None = None, shards: int | None = None,
                  processed_column: str | None = None,
                  deletes_table: str | None = None) -> list[str]:
    """Create what the watcher needs on `table` (schema.table), in one transaction that it
    commits; return the statements run. Running it again changes nothing."""
    if (shard_column is None) != (shards is None) or (shards is not None and shards < 1):
        raise InvalidArgument(f"shard_column {shard_column!r} and shards {shards!r}: give "
                              "both, with shards at least 1, or neither")
    if processed_column is not None and shard_column is None:
        raise InvalidArgument(f"processed_column {processed_column!r} needs a shard column: "
                              "a processed row leaves the index through it (CW-7)")
    autocommit = conn.autocommit
    if autocommit:
        conn.autocommit = False
    try:
        statements = _statements(conn, table, timestamp_column, shard_column, shards,
                                 processed_column, deletes_table)
        texts = [s.as_string(conn) for s in statements]
        with conn.cursor() as cur:
            for text in texts:
                cur.execute(text)
        conn.commit()
    except CdcflowError:
        conn.rollback()
        raise
    except Exception as error:
        conn.rollback()
        raise typed(error, f"preparing {table!r} for the watcher") from None
    finally:
        if autocommit:
            conn.autocommit = True
    return texts


def _statements(conn: Any, table: str, stamp: str, shard: str | None, shards: int | None,
                processed: str | None, deletes: str | None) -> list[sql.Composable]:
    schema, _ = split_name(table)
    oid, keys = _table_key(conn, table)
    target, ts = qualified(table), sql.Identifier(stamp)
    found = [sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} timestamptz").format(
        target, ts)]
    if processed is not None:
        found.append(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} boolean NOT NULL "
                             "DEFAULT false").format(target, sql.Identifier(processed)))
    found += _trigger(conn, schema, f"cdcflow_stamp_{oid}", "cdcflow_stamp",
                      "BEFORE INSERT OR UPDATE", target, _stamp_body(ts, processed))
    index_columns = [ts]
    where = sql.SQL("{} IS NOT NULL").format(ts)
    if shard is not None:
        found.append(_shard_column(target, shard, shards or 1, keys, processed))
        index_columns.insert(0, sql.Identifier(shard))
        where = sql.SQL("{} IS NOT NULL AND ").format(sql.Identifier(shard)) + where
    found.append(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} ({}) WHERE {}").format(
        sql.Identifier(f"cdcflow_watch_{oid}"), target, sql.SQL(", ").join(index_columns),
        where))
    if deletes is not None:
        found += _deletes(conn, schema, oid, target, deletes if "." in deletes else
                          f"{schema}.{deletes}", keys)
    return found


def _table_key(conn: Any, table: str) -> tuple[int, list[tuple[str, str]]]:
    with conn.cursor() as cur:
        cur.execute(_TABLE, split_name(table))
        row = cur.fetchone()
        if row is None:
            raise NotFound(f"table {table!r} does not exist (name it as schema.table)")
        cur.execute(_KEY, (row[0],))
        keys = [(str(name), str(kind)) for name, kind in cur.fetchall()]
    if not keys:
        raise InvalidArgument(f"table {table!r} has no primary key: the watcher's cursor "
                              "and the shard expression need one")
    return int(row[0]), keys


def _stamp_body(ts: sql.Identifier, processed: str | None) -> sql.Composable:
    reset = sql.SQL("")
    if processed is not None:
        column = sql.Identifier(processed)
        reset = sql.SQL("IF TG_OP = 'UPDATE' AND NEW.{} IS NOT DISTINCT FROM OLD.{} THEN "
                        "NEW.{} := false; END IF; ").format(column, column, column)
    return sql.SQL("BEGIN IF current_setting({}, true) = 'on' THEN RETURN NEW; END IF; "
                   "NEW.{} := now(); {}RETURN NEW; END").format(
        sql.Literal(CLEANUP_SETTING), ts, reset)


def _shard_column(target: sql.Composable, shard: str, shards: int,
                  keys: list[tuple[str, str]], processed: str | None) -> sql.Composable:
    """CW-3: the shard, computed from the primary key; NULL while processed (CW-7)."""
    text = sql.SQL(" || '|' || ").join(sql.SQL("{}::text").format(sql.Identifier(k))
                                       for k, _ in keys)
    value = sql.SQL("mod(hashtextextended({}, 0), {})").format(text, sql.Literal(shards))
    if processed is not None:
        value = sql.SQL("CASE WHEN {} THEN NULL ELSE {} END").format(
            sql.Identifier(processed), value)
    return sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} bigint GENERATED ALWAYS AS "
                   "({}) STORED").format(target, sql.Identifier(shard), value)


def _trigger(conn: Any, schema: str, function: str, name: str, when: str,
             target: sql.Composable, body: sql.Composable) -> list[sql.Composable]:
    """A trigger function (its body rendered, then passed as a string literal) and the
    trigger that runs it."""
    qualified_function = sql.SQL("{}.{}").format(sql.Identifier(schema),
                                                  sql.Identifier(function))
    return [sql.SQL("CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS {}"
                    ).format(qualified_function, sql.Literal(body.as_string(conn))),
            sql.SQL("CREATE OR REPLACE TRIGGER {} " + when + " ON {} FOR EACH ROW EXECUTE "
                    "FUNCTION {}()").format(sql.Identifier(name), target, qualified_function)]


def _deletes(conn: Any, schema: str, oid: int, target: sql.Composable, deletes: str,
             keys: list[tuple[str, str]]) -> list[sql.Composable]:
    table = qualified(deletes)
    names = [sql.Identifier(k) for k, _ in keys]
    columns = sql.SQL(", ").join(sql.SQL("{} {} NOT NULL").format(n, sql.SQL(kind))
                                 for n, (_, kind) in zip(names, keys, strict=True))
    body = sql.SQL("BEGIN INSERT INTO {} ({}) VALUES ({}); RETURN OLD; END").format(
        table, sql.SQL(", ").join(names),
        sql.SQL(", ").join(sql.SQL("OLD.{}").format(n) for n in names))
    return [sql.SQL("CREATE TABLE IF NOT EXISTS {} (_cdcflow_id bigserial PRIMARY KEY, "
                    "deleted_at timestamptz NOT NULL DEFAULT now(), {})").format(table, columns),
            sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (deleted_at, _cdcflow_id)").format(
                sql.Identifier(f"cdcflow_deleted_{oid}"), table),
            *_trigger(conn, schema, f"cdcflow_deletes_{oid}", "cdcflow_deletes", "AFTER DELETE",
                      target, body)]


def clean_table(conn: Any, table: WatchedTable, cutoff: datetime, batch_rows: int) -> int:
    """Batches of rows with a timestamp before `cutoff` get a NULL one, each batch its own
    transaction with the stamp trigger stood aside; a deletes table loses its older entries.
    FOR UPDATE locks each row and checks it again, so a row updated meanwhile is kept."""
    ts, target = sql.Identifier(table.commit_timestamp_column), qualified(table.name)
    update = sql.SQL("UPDATE {} SET {} = NULL WHERE ctid = ANY(ARRAY(SELECT ctid FROM {} "
                     "WHERE {} < %s LIMIT %s FOR UPDATE))").format(target, ts, target, ts)
    cleaned = _batches(conn, update, cutoff, batch_rows)
    if table.deletes_table is not None:
        deletes = qualified(table.deletes_table)
        _batches(conn, sql.SQL("DELETE FROM {} WHERE _cdcflow_id = ANY(ARRAY(SELECT "
                               "_cdcflow_id FROM {} WHERE deleted_at < %s LIMIT %s))").format(
            deletes, deletes), cutoff, batch_rows)
    return cleaned


def _batches(conn: Any, statement: sql.Composable, cutoff: datetime, batch_rows: int) -> int:
    total = 0
    autocommit, conn.autocommit = conn.autocommit, False
    try:
        while True:
            with conn.cursor() as cur:
                cur.execute("SELECT set_config(%s, 'on', true)", (CLEANUP_SETTING,))
                cur.execute(statement, (cutoff, batch_rows))
                changed = int(cur.rowcount)
            conn.commit()
            total += changed
            if changed == 0:
                return total
    except Exception as error:
        conn.rollback()
        raise typed(error, "cleaning up") from None
    finally:
        conn.autocommit = autocommit
