"""Column types stored once per file, not once per data record (log format 4).

A data record's body (`cdcflow.store.capture.record_body`) starts with its column types,
which every record of a table repeats: about half of a small record's bytes. `_log` keeps the
body without them, and `_log.types` names a row of `_column_types` that holds their text.
`split` and `joined` are exact inverses for any text, so a reader gets back the very body
the writer gave, byte for byte; a body that does not start with column types (a
child-partitions record, say) is kept whole, with `types` NULL, as every body was before
format 4.

A connection made by `cdcflow.store.sqlite.connect` caches the ids it wrote (forgotten when a
write transaction rolls back: the rows may be gone) and the texts it read (a row of
`_column_types` never changes and is never deleted). Any other connection looks them up.
"""

from __future__ import annotations

import sqlite3
from typing import Final

from cdcflow.errors import DataLoss

TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS _column_types ("
    "id INTEGER PRIMARY KEY, text TEXT NOT NULL UNIQUE)"
)

_PREFIX: Final = '{"column_types":'
_MODS: Final = ',"mods":'


def split(body: str) -> tuple[str | None, str]:
    """(column types text, the body without them), or (None, body) when it does not start
    with them. Any text of the body's first key's value up to the first `,"mods":` counts: a
    quote inside a JSON string is escaped, so that is where the column types end."""
    if not body.startswith(_PREFIX):
        return None, body
    end = body.find(_MODS, len(_PREFIX))
    if end < 0:
        return None, body
    return body[len(_PREFIX):end], "{" + body[end + 1:]


def joined(types: str, rest: str) -> str:
    """The body `split` took apart."""
    return _PREFIX + types + "," + rest[1:]


class TypeIds:
    """The ids of column types texts in one file, for one write transaction at a time."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        cache: dict[str, int] | None = getattr(conn, "type_ids", None)
        self.ids: dict[str, int] = {} if cache is None else cache

    def stored(self, body: str, types: str | None = None) -> tuple[str, int | None]:
        """What `_log` keeps of a data record's body: (the rest of it, its types' id).
        `types`: the body is `split`'s rest already, and these its column types."""
        rest = body
        if types is None:
            types, rest = split(body)
            if types is None:
                return body, None
        found = self.ids.get(types)
        return rest, self._add(types) if found is None else found

    def _add(self, types: str) -> int:
        self.conn.execute("INSERT INTO _column_types(text) VALUES (?) "
                          "ON CONFLICT(text) DO NOTHING", (types,))
        (found,) = self.conn.execute(
            "SELECT id FROM _column_types WHERE text = ?", (types,)).fetchone()
        self.ids[types] = int(found)
        return int(found)


def forget_written(conn: sqlite3.Connection) -> None:
    """After a rollback: the ids this connection added may be gone."""
    cache: dict[str, int] | None = getattr(conn, "type_ids", None)
    if cache is not None:
        cache.clear()


def read_bodies(conn: sqlite3.Connection, rows: list[tuple[int, int, int, str, int | None]]
                ) -> list[tuple[int, int, int, str]]:
    """(micros, seq, kind, body) of `_log` rows read with their `types`: whole bodies."""
    return [(micros, seq, kind, body if types is None else joined(types, body))
            for micros, seq, kind, body, types in read_parts(conn, rows)]


def read_parts(conn: sqlite3.Connection, rows: list[tuple[int, int, int, str, int | None]]
               ) -> list[tuple[int, int, int, str, str | None]]:
    """(micros, seq, kind, body, column types text) of `_log` rows read with their `types`:
    the body as `_log` keeps it, and the text of the column types it names (None: the body is
    whole)."""
    cache: dict[int, str] | None = getattr(conn, "type_texts", None)
    texts: dict[int, str] = {} if cache is None else cache
    out: list[tuple[int, int, int, str, str | None]] = []
    for micros, seq, kind, body, ref in rows:
        if ref is None:
            out.append((micros, seq, kind, body, None))
            continue
        types = texts.get(ref)
        if types is None:
            types = texts[ref] = _text(conn, ref)
        out.append((micros, seq, kind, body, types))
    return out


def _text(conn: sqlite3.Connection, ref: int) -> str:
    row = conn.execute("SELECT text FROM _column_types WHERE id = ?", (ref,)).fetchone()
    if row is None:  # written in the same transaction as the records that name it
        raise DataLoss(f"a record names column types {ref}, which _column_types does not "
                       "hold: every record's column types are written with it, so the file "
                       "was changed outside cdcflow")
    return str(row[0])
