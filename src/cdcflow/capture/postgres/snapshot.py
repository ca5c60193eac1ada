"""Reading tables in chunks, in key order, as their types' output text (what pgoutput sends),
converted to the record encoding by the same converters as the stream's."""

from __future__ import annotations

from typing import Any

import psycopg2.extensions
from psycopg2 import sql

from cdcflow.capture.postgres.types import converter
from cdcflow.capture.source import SourceObject


def read_chunk(conn: Any, item: SourceObject, after: Any, first: str | None,
               limit: int) -> tuple[list[dict[str, Any]], Any, bool]:
    """Up to `limit` rows after the resume token `after` (None: from the start), each a dict
    in the record encoding; the token after them; and whether more may follow.

    Rows go in key order; a table without a key in ctid order, and when read in a newer
    snapshot than the slot's (`first`, the slot's pg_snapshot) only the rows the slot's
    snapshot saw: the slot streams the others."""
    schema, table = item.name.split(".", 1)
    order = [sql.Identifier(k) for k in item.primary_key] or [sql.SQL("ctid")]
    texts = sql.SQL(", ").join(sql.SQL("{} AS {}").format(
        sql.Identifier(c.name), sql.Identifier(f"_cdcflow_{i}"))
        for i, c in enumerate(item.columns))
    source = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table))
    as_output_text(conn, sql.SQL("SELECT {} FROM {} LIMIT 0").format(texts, source))
    order_list = sql.SQL(", ").join(order)
    seen = sql.SQL("TRUE") if item.primary_key or first is None else _visible_in(first)
    where = sql.SQL("") if after is None else sql.SQL(" AND ({}) > ({})").format(
        order_list, sql.SQL(", ").join(sql.Placeholder() * len(order)))
    query = sql.SQL("SELECT {}, {} FROM {} WHERE {}{} ORDER BY {} LIMIT {}").format(
        order_list, texts, source, seen, where, order_list, sql.Literal(limit))
    with conn.cursor() as cur:
        cur.execute(query, after or ())
        fetched = cur.fetchall()
    if not fetched:
        return [], after, False
    convert = [(c.name, converter(c.type)) for c in item.columns]
    rows = [{name: to_value(text) for (name, to_value), text in
             zip(convert, row[len(order):], strict=True)} for row in fetched]
    token = [v if isinstance(v, int | str) else str(v) for v in fetched[-1][:len(order)]]
    return rows, token, len(fetched) == limit


def _visible_in(snapshot: str) -> Any:
    """A condition: the row's inserting transaction committed before `snapshot` (a
    pg_snapshot text, xmin:xmax:xip). Transaction ids compare modulo 2^32 (xmin is 32 bits);
    frozen rows (ids below 3) count as old."""
    low, high, running = snapshot.split(":")
    ids = [int(x) % 2**32 for x in running.split(",") if x]

    def before(bound: int) -> Any:
        return sql.SQL("(mod({} - xmin::text::bigint + 4294967296, 4294967296) "
                       "BETWEEN 1 AND 2147483647)").format(sql.Literal(bound % 2**32))

    return sql.SQL("(xmin::text::bigint < 3 OR {} OR ({} AND xmin::text::bigint <> ALL({})))"
                   ).format(before(int(low)), before(int(high)),
                            sql.Literal(ids or [-1]))


def as_output_text(conn: Any, query: Any) -> None:
    """Have `conn` return the columns of `query` as their types' output text, exactly what
    pgoutput sends (a `::text` cast differs for some types: bool gives true, char trims)."""
    with conn.cursor() as cur:
        cur.execute(query)
        oids = tuple({column.type_code for column in cur.description})
    raw = psycopg2.extensions.new_type(oids, "CDCFLOW_TEXT", lambda value, cursor: value)
    psycopg2.extensions.register_type(raw, conn)  # arrays too: their OIDs are in `oids`
