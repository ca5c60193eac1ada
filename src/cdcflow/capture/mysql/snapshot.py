"""Reading tables in chunks, in key order, inside the snapshot's transaction, converted by the
same converters as the binlog's rows. Identifiers are quoted; values are bound parameters."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cdcflow.capture.mysql.catalog import MySqlTable
from cdcflow.capture.mysql.connection import Endpoint, connect, query
from cdcflow.capture.mysql.types import converter
from cdcflow.capture.source import SourceObject
from cdcflow.model.types import ColumnType, decode_value


def quote(identifier: str) -> str:
    return "`" + identifier.replace("`", "``") + "`"


def open_consistent(endpoint: Endpoint, mariadb: bool) -> tuple[Any, dict[str, Any]]:
    """A connection inside a fresh consistent-snapshot transaction, and the binlog position
    that snapshot corresponds to ({"gtid", "log_file", "log_position"}): every transaction
    the binlog holds before it is visible, none after. MariaDB reports that position without
    a lock (`binlog_snapshot_file`/`_position`); MySQL takes it under a brief FLUSH TABLES
    WITH READ LOCK."""
    conn = connect(endpoint)
    conn.autocommit(False)
    try:
        if mariadb:
            query(conn, "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            status = dict(query(conn, "SHOW STATUS LIKE 'binlog_snapshot_%'"))
            log_file, offset = str(status["Binlog_snapshot_file"]), \
                int(status["Binlog_snapshot_position"])
            ((gtid,),) = query(conn, "SELECT BINLOG_GTID_POS(%s, %s)", (log_file, offset))
        else:
            query(conn, "FLUSH TABLES WITH READ LOCK", (), "locking for the snapshot (RELOAD)")
            try:
                query(conn, "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
                log_file, offset, _, _, gtid = (list(query(conn, "SHOW MASTER STATUS")[0])
                                                + [None] * 5)[:5]
            finally:
                query(conn, "UNLOCK TABLES")
    except BaseException:
        conn.close()
        raise
    return conn, {"gtid": str(gtid or ""), "log_file": str(log_file),
                  "log_position": int(offset)}


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
