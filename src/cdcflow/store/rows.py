"""Versioned row storage: every commit adds a version (or a tombstone) per changed row.

A read at timestamp T sees, per key, the latest version with commit_micros <= T. Versions that
no read can see any more (superseded before the version-retention cutoff) are removed by `gc`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from cdcflow.model.schema import TableSchema
from cdcflow.model.types import decode_value


def latest_version(
    conn: sqlite3.Connection, storage: str, encoded_key: str, at_micros: int | None = None
) -> dict[str, Any] | None:
    """The JSON-encoded row of a key as of `at_micros` (None: newest), or None if absent."""
    if at_micros is None:
        row = conn.execute(
            f"SELECT deleted, row FROM {storage} WHERE key = ? "
            "ORDER BY commit_micros DESC LIMIT 1",
            (encoded_key,),
        ).fetchone()
    else:
        row = conn.execute(
            f"SELECT deleted, row FROM {storage} WHERE key = ? AND commit_micros <= ? "
            "ORDER BY commit_micros DESC LIMIT 1",
            (encoded_key, at_micros),
        ).fetchone()
    if row is None or row[0]:
        return None
    result: dict[str, Any] = json.loads(row[1])
    return result


KEYS_PER_READ = 500
"""Keys looked up by one statement (far under SQLite's bound on parameters)."""


def latest_versions(
    conn: sqlite3.Connection, storage: str, encoded_keys: list[str]
) -> dict[str, dict[str, Any] | None]:
    """The newest JSON-encoded row of each key (None: absent or deleted), a statement per
    `KEYS_PER_READ` keys. SQLite gives the bare columns of the row holding the MAX."""
    found: dict[str, dict[str, Any] | None] = dict.fromkeys(encoded_keys)
    for start in range(0, len(encoded_keys), KEYS_PER_READ):
        chunk = encoded_keys[start:start + KEYS_PER_READ]
        marks = ",".join("?" * len(chunk))
        for key, deleted, row, _ in conn.execute(
            f"SELECT key, deleted, row, MAX(commit_micros) FROM {storage} "
            f"WHERE key IN ({marks}) GROUP BY key", chunk
        ):
            found[key] = None if deleted else json.loads(row)
    return found


def scan_versions(
    conn: sqlite3.Connection,
    storage: str,
    at_micros: int,
    hash_start: int = 0,
    hash_end: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Live JSON-encoded rows as of `at_micros` whose key hash lies in [hash_start, hash_end)."""
    if hash_end is not None and hash_end <= hash_start:
        return
    upper = "AND key_hash < ?" if hash_end is not None else ""
    params: list[int] = [at_micros, hash_start] + ([hash_end] if hash_end is not None else [])
    cursor = conn.execute(
        f"SELECT deleted, row, MAX(commit_micros) FROM {storage} "
        f"WHERE commit_micros <= ? AND key_hash >= ? {upper} GROUP BY key ORDER BY key",
        params,
    )
    for deleted, row, _ in cursor:
        if not deleted:
            yield json.loads(row)


def count_versions(conn: sqlite3.Connection, storage: str, keys: list[str], after_micros: int,
                   up_to_micros: int) -> dict[str, int]:
    """How many versions (deletions too) each encoded key has in (after, up_to]."""
    found: dict[str, int] = {}
    for start in range(0, len(keys), 500):
        chunk = keys[start:start + 500]
        marks = ", ".join("?" * len(chunk))
        found.update(conn.execute(
            f"SELECT key, count(*) FROM {storage} WHERE key IN ({marks}) AND "
            "commit_micros > ? AND commit_micros <= ? GROUP BY key",
            [*chunk, after_micros, up_to_micros]).fetchall())
    return found


VersionRow = tuple[str, int, int, int, str | None]
"""(encoded key, commit micros, key hash, deleted, JSON row): one row of a storage table."""


def version_row(
    encoded_key: str, micros: int, key_hash: int, row: dict[str, Any] | None
) -> VersionRow:
    return (encoded_key, micros, key_hash, int(row is None),
            None if row is None else encode_row(row))


def write_versions(conn: sqlite3.Connection, storage: str, rows: Iterable[VersionRow]) -> None:
    conn.executemany(
        f"INSERT INTO {storage}(key, commit_micros, key_hash, deleted, row) VALUES (?,?,?,?,?)",
        rows,
    )


def encode_row(row: dict[str, Any]) -> str:
    """A row's JSON text. orjson takes every encoded value but an integer beyond 64 bits,
    which only a JSON column can hold; the standard encoder writes that one. Rows are read
    back with `json.loads`, which keeps such integers exact (orjson's would not)."""
    try:
        return orjson.dumps(row).decode()
    except orjson.JSONEncodeError:
        return json.dumps(row)


def decode_row(schema: TableSchema, encoded: dict[str, Any]) -> dict[str, Any]:
    """Python values of a JSON-encoded row, for the columns the schema has now."""
    return {c.name: decode_value(encoded.get(c.name), c.type) for c in schema.columns}


def gc_versions(conn: sqlite3.Connection, storage: str, cutoff_micros: int,
                after_key: str | None = None, through_key: str | None = None) -> int:
    """Drop versions superseded at or before the cutoff, and tombstones older than it; of the
    keys in (`after_key`, `through_key`] only, where given (None: no bound)."""
    bounds, params = _key_bounds(after_key, through_key)
    superseded = conn.execute(
        f"DELETE FROM {storage} AS old WHERE commit_micros < ? {bounds} AND EXISTS ("
        f"SELECT 1 FROM {storage} AS newer WHERE newer.key = old.key "
        "AND newer.commit_micros > old.commit_micros AND newer.commit_micros <= ?)",
        (cutoff_micros, *params, cutoff_micros),
    ).rowcount
    tombstones = conn.execute(
        f"DELETE FROM {storage} AS old WHERE deleted = 1 AND commit_micros < ? {bounds} "
        f"AND NOT EXISTS (SELECT 1 FROM {storage} AS newer WHERE newer.key = old.key "
        "AND newer.commit_micros > old.commit_micros)",
        (cutoff_micros, *params),
    ).rowcount
    return int(superseded) + int(tombstones)


def _key_bounds(after_key: str | None, through_key: str | None) -> tuple[str, list[str]]:
    bounds, params = "", []
    if after_key is not None:
        bounds, params = "AND old.key > ? ", [after_key]
    if through_key is not None:
        bounds, params = bounds + "AND old.key <= ? ", [*params, through_key]
    return bounds, params


def next_versions(conn: sqlite3.Connection, storage: str, after_key: str | None,
                  limit: int) -> tuple[str | None, int]:
    """The next `limit` versions in key order after `after_key` (None: from the first): the
    key of the last of them, or None when fewer are left, and how many there are (at most
    `limit`)."""
    where, params = ("WHERE key > ?", [after_key]) if after_key is not None else ("", [])
    (count,) = conn.execute(f"SELECT count(*) FROM (SELECT 1 FROM {storage} {where} LIMIT ?)",
                            [*params, limit]).fetchone()
    if count < limit:
        return None, int(count)
    (last,) = conn.execute(f"SELECT key FROM {storage} {where} ORDER BY key LIMIT 1 OFFSET ?",
                           [*params, limit - 1]).fetchone()
    return str(last), int(count)
