"""Reading tables in chunks, in key order, inside the snapshot's transaction, converted by the
same converters as the binlog's rows. Identifiers are quoted; values are bound parameters."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cdcflow.capture.mysql.catalog import MySqlTable
from cdcflow.capture.mysql.connection import query
from cdcflow.capture.mysql.types import converter
from cdcflow.capture.source import SourceObject
from cdcflow.model.types import ColumnType, decode_value


def quote(identifier: str) -> str:
    return "`" + identifier.replace("`", "``") + "`"


def read_chunk(conn: Any, table: MySqlTable, item: SourceObject, after: Any,
               limit: int) -> tuple[list[dict[str, Any]], Any, bool]:
    """Up to `limit` rows after the resume token `after` (None: from the start) as Python
    values; the token after them; and whether more may follow. A table without a primary
    key is read whole in one chunk (it cannot resume midway)."""
    keys = list(item.primary_key)
    columns = ", ".join(quote(c.name) for c in table.columns)
    source = f"{quote(table.database)}.{quote(table.name)}"
    convert = _converters(table, item)
    if not keys:
        rows = query(conn, f"SELECT {columns} FROM {source}", (), f"reading {item.name}")
        return [_python(row, convert) for row in rows], None, False
    order = ", ".join(quote(k) for k in keys)
    where = "" if after is None else \
        f" WHERE ({order}) > ({', '.join(['%s'] * len(keys))})"
    fetched = query(conn, f"SELECT {columns} FROM {source}{where} ORDER BY {order} "
                          f"LIMIT {int(limit)}", tuple(after or ()), f"reading {item.name}")
    if not fetched:
        return [], after, False
    names = [c.name for c in table.columns]
    last = dict(zip(names, fetched[-1], strict=True))
    token = [_token(last[k]) for k in keys]
    return [_python(row, convert) for row in fetched], token, len(fetched) == limit


def _token(value: Any) -> Any:
    if isinstance(value, int | str) or value is None:
        return value
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return str(value)


Converters = list[tuple[str, Callable[[Any], Any], ColumnType]]


def _converters(table: MySqlTable, item: SourceObject) -> Converters:
    return [(column.name, converter(source_column, column.type), column.type)
            for column, source_column in zip(item.columns, table.columns, strict=True)]


def _python(row: tuple[Any, ...], convert: Converters) -> dict[str, Any]:
    """A row as Python values, through the record encoding the binlog's rows get."""
    return {name: None if value is None else decode_value(to_record(value), ctype)
            for (name, to_record, ctype), value in zip(convert, row, strict=True)}
