"""The merge rule of a CDC table, vectorised in Arrow: per key, the greatest (sequence,
ingestion) wins; a DELETE leaves a tombstone that beats older UPSERTs until its retention
window ends (AP-4, AP-7). One key range ("file") is merged at a time, so the cost follows the
changes and the ranges they touch.

Orders are compared as text: the sequence sort key, a NUL, the ingestion time and the row
index zero-padded. A sequence key that is a prefix of another sorts first, as AP-4 wants.
"""

from __future__ import annotations

import bisect
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

Key = tuple[Any, ...]
ORDER = "_cdcflow_order"
STATE_FIELDS = [("_seq_key", pa.string()), ("_ingest", pa.int64()), ("_row", pa.int64()),
                ("_deleted_at", pa.int64())]


def state_schema(schema: pa.Schema, primary_key: tuple[str, ...]) -> pa.Schema:
    return pa.schema([schema.field(k) for k in primary_key]
                     + [pa.field(n, t) for n, t in STATE_FIELDS])


def key_array(table: pa.Table, primary_key: tuple[str, ...]) -> pa.Array:
    """One value per row identifying its key; for equality and membership tests only, not
    for ordering. A composite key joins its columns' bytes, each after its length (`1:a:2:bc`),
    so no two keys join alike, whatever separators their values hold."""
    if len(primary_key) == 1:
        return pa.chunked_array(table.column(primary_key[0])).combine_chunks()
    parts = []
    for name in primary_key:
        column = table.column(name)
        if not (pa.types.is_string(column.type) or pa.types.is_binary(column.type)):
            column = pc.cast(column, pa.string())
        data = pc.cast(column, pa.binary())
        parts += [pc.cast(pc.cast(pc.binary_length(data), pa.string()), pa.binary()), data]
    joined = pc.binary_join_element_wise(*parts, pa.scalar(b":", pa.binary()))
    return pa.chunked_array(joined).combine_chunks()


def order_text(seq_key: Any, ingest: Any, row: Any) -> Any:
    padded = [pc.utf8_lpad(pc.cast(x, pa.string()), width, padding="0")
              for x, width in ((ingest, 20), (row, 12))]
    return pc.binary_join_element_wise(seq_key, *padded, "\x00")


def order_of(seq_key: str, ingest: int, row: int) -> str:
    """The same text for one order, in Python."""
    return f"{seq_key}\x00{ingest:020d}\x00{row:012d}"


def winners(changes: pa.Table, primary_key: tuple[str, ...]) -> pa.Table:
    """The greatest change per key, sorted by key; duplicates and arrival order don't matter.
    `changes` has the key columns, the row columns, _CHANGE_TYPE and the order parts."""
    if changes.num_rows == 0:
        return changes.append_column(ORDER, pa.array([], pa.string()))
    ordered = changes.append_column(
        ORDER, order_text(changes.column("_cdcflow_seq_key"), changes.column("_cdcflow_ingest"),
                          changes.column("_cdcflow_row")))
    ordered = ordered.sort_by([(k, "ascending") for k in primary_key] + [(ORDER, "ascending")])
    keys = key_array(ordered, primary_key)
    if len(keys) == 1:
        return ordered
    last = pc.not_equal(keys.slice(0, len(keys) - 1), keys.slice(1))
    last = pa.concat_arrays([last.combine_chunks() if isinstance(last, pa.ChunkedArray)
                             else last, pa.array([True])])
    return ordered.filter(last)


def key_tuples(table: pa.Table, primary_key: tuple[str, ...]) -> list[Key]:
    columns = [table.column(k).to_pylist() for k in primary_key]
    return list(zip(*columns, strict=True))


def assign_slices(lows: list[Key], keys: list[Key]) -> dict[int, tuple[int, int]]:
    """For keys sorted ascending: file index -> [start, end) of the keys it holds (a file
    holds keys from its lowest key up to the next file's lowest key)."""
    slices: dict[int, tuple[int, int]] = {}
    if not keys:
        return slices
    if not lows:
        return {0: (0, len(keys))}
    bounds = [0] + [bisect.bisect_left(keys, low) for low in lows[1:]] + [len(keys)]
    for index in range(len(lows)):
        if bounds[index] < bounds[index + 1]:
            slices[index] = (bounds[index], bounds[index + 1])
    return slices


def merge_range(data: pa.Table, state: pa.Table, changes: pa.Table, schema: pa.Schema,
                primary_key: tuple[str, ...], now_micros: int,
                retention_micros: int) -> tuple[pa.Table, pa.Table, int]:
    """Merge winning changes (from `winners`) into one range; return its sorted data and
    state, and how many changes took effect. Expired tombstones are dropped first."""
    target_state = state_schema(schema, primary_key)
    # a tombstone whose window has passed no longer blocks anything, in this apply too
    cutoff = now_micros - retention_micros
    expired = pc.fill_null(pc.less(state.column("_deleted_at"), cutoff), False)
    state = state.filter(pc.invert(expired))
    effective = changes
    if state.num_rows and changes.num_rows:
        known_orders = order_text(state.column("_seq_key"), state.column("_ingest"),
                                  state.column("_row"))
        position = pc.index_in(key_array(changes, primary_key),
                               value_set=key_array(state, primary_key))
        known = pc.take(known_orders, position)
        newer = pc.or_kleene(pc.is_null(known), pc.greater(changes.column(ORDER), known))
        effective = changes.filter(pc.fill_null(newer, True))
    if effective.num_rows:
        touched = key_array(effective, primary_key)
        if data.num_rows:
            data = data.filter(pc.invert(pc.is_in(key_array(data, primary_key),
                                                  value_set=touched)))
        if state.num_rows:
            state = state.filter(pc.invert(pc.is_in(key_array(state, primary_key),
                                                    value_set=touched)))
        deletes = pc.equal(effective.column("_CHANGE_TYPE"), "DELETE")
        upserts = effective.filter(pc.invert(deletes)).select(schema.names).cast(schema)
        data = pa.concat_tables([data.cast(schema), upserts])
        deleted_at = pc.if_else(deletes, pa.scalar(now_micros, pa.int64()),
                                pa.nulls(effective.num_rows, pa.int64()))
        new_state = pa.table(
            [effective.column(k) for k in primary_key] + [
                effective.column("_cdcflow_seq_key"), effective.column("_cdcflow_ingest"),
                effective.column("_cdcflow_row"), deleted_at],
            schema=target_state)
        state = pa.concat_tables([state.cast(target_state), new_state])
    order = [(k, "ascending") for k in primary_key]
    return data.sort_by(order), state.sort_by(order), effective.num_rows


def split(data: pa.Table, state: pa.Table, primary_key: tuple[str, ...],
          target_rows: int) -> list[tuple[pa.Table, pa.Table]]:
    """Split a range that grew past twice the target into ranges of about the target size,
    cutting at state keys (tombstones included) and taking each piece's rows along."""
    if state.num_rows <= 2 * target_rows:
        return [(data, state)]
    pieces = []
    keys = key_array(state, primary_key)
    data_keys = key_array(data, primary_key)
    for start in range(0, state.num_rows, target_rows):
        chunk = state.slice(start, target_rows)
        mask = pc.is_in(data_keys, value_set=keys.slice(start, target_rows))
        pieces.append((data.filter(mask), chunk))
    return pieces
