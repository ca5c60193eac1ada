"""Merge-on-read apply of one key range (tables with deletion_vectors): instead of rewriting
the range, hide the changed keys' base rows with a deletion vector and rewrite only the
range's patch, which holds every key changed since the base was written. The work follows
the changes: the base is read for its key column only, and its state only when a change
might be older than something in it (the entry's max_order says when it cannot be).

A range is compacted (rewritten whole, as without deletion vectors) once the rows its base
hides and its patch holds pass COMPACT_FRACTION of the base, so reads stay within that
overhead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyroaring import BitMap64

from cdcflow.table.deletion_vectors import read_vector
from cdcflow.table.layout import FileEntry, read_patch_state
from cdcflow.table.merge import ORDER, key_array, order_text, state_schema

COMPACT_FRACTION = 0.25
MIN_BASE_ROWS = 8_000


@dataclass(slots=True)
class RangePatch:
    """What a merge-on-read apply writes for one range."""

    hidden: BitMap64  # base positions to hide, the old vector's included
    data: pa.Table  # the new patch's rows, sorted by key
    state: pa.Table  # the new patch's state, sorted by key
    applied: int


def patchable(entry: FileEntry, changes: int) -> bool:
    """Whether a range takes `changes` more as a patch rather than a rewrite."""
    if entry.rows < MIN_BASE_ROWS:
        return False
    hidden = entry.vector.cardinality if entry.vector else 0
    patched = entry.patch.rows if entry.patch else 0
    return hidden + patched + changes <= COMPACT_FRACTION * entry.rows


def known_orders(root: Path, entry: FileEntry, changes: pa.Table, patch_state: pa.Table,
                 schema: pa.Schema, primary_key: tuple[str, ...], cutoff: int) -> pa.Array:
    """Per change, the order its key holds now (NULL if none, or an expired tombstone):
    the patch's state first, then the base's state, read only when it could matter."""
    keys = key_array(changes, primary_key)
    known = _orders_of(patch_state, keys, primary_key, cutoff)
    newest = entry.max_order
    maybe_older = newest is None or not pc.all(
        pc.greater(changes.column(ORDER), pa.scalar(newest, pa.string()))).as_py()
    if maybe_older:
        base = pq.read_table(root / entry.state).cast(state_schema(schema, primary_key))
        base = base.filter(pc.is_in(key_array(base, primary_key), value_set=keys))
        known = pc.coalesce(known, _orders_of(base, keys, primary_key, cutoff))
    return known


def _orders_of(state: pa.Table, keys: pa.Array, primary_key: tuple[str, ...],
               cutoff: int) -> pa.Array:
    if not state.num_rows:
        return pa.nulls(len(keys), pa.string())
    expired = pc.fill_null(pc.less(state.column("_deleted_at"), cutoff), False)
    orders = order_text(state.column("_seq_key"), state.column("_ingest"), state.column("_row"))
    orders = pc.if_else(expired, pa.scalar(None, pa.string()), orders)
    position = pc.index_in(keys, value_set=key_array(state, primary_key))
    return pc.take(orders, position)


def patch_range(root: Path, entry: FileEntry, changes: pa.Table, schema: pa.Schema,
                primary_key: tuple[str, ...], now_micros: int,
                retention_micros: int) -> RangePatch:
    """Merge winning changes (from `winners`, sorted by key) into a range's patch."""
    target = state_schema(schema, primary_key)
    patch_state = read_patch_state(root, entry, schema, primary_key)
    patch_data = (pq.read_table(root / entry.patch.data).select(schema.names).cast(schema)
                  if entry.patch is not None and entry.patch.rows else schema.empty_table())
    known = known_orders(root, entry, changes, patch_state, schema, primary_key,
                         now_micros - retention_micros)
    newer = pc.or_kleene(pc.is_null(known), pc.greater(changes.column(ORDER), known))
    effective = changes.filter(pc.fill_null(newer, True))
    hidden = read_vector(root, entry.vector) if entry.vector else BitMap64()
    if not effective.num_rows:
        return RangePatch(hidden, patch_data, patch_state, 0)
    touched = key_array(effective, primary_key)
    base_keys = pq.ParquetFile(root / entry.data).read(columns=list(primary_key))
    hidden = hidden | BitMap64(base_positions(key_array(base_keys, primary_key), touched))
    deletes = pc.equal(effective.column("_CHANGE_TYPE"), "DELETE")
    upserts = effective.filter(pc.invert(deletes)).select(schema.names).cast(schema)
    kept_data = patch_data.filter(pc.invert(pc.is_in(key_array(patch_data, primary_key),
                                                     value_set=touched)))
    kept_state = patch_state.filter(pc.invert(pc.is_in(key_array(patch_state, primary_key),
                                                       value_set=touched)))
    deleted_at = pc.if_else(deletes, pa.scalar(now_micros, pa.int64()),
                            pa.nulls(effective.num_rows, pa.int64()))
    new_state = pa.table(
        [effective.column(k) for k in primary_key] + [
            effective.column("_cdcflow_seq_key"), effective.column("_cdcflow_ingest"),
            effective.column("_cdcflow_row"), deleted_at], schema=target)
    order = [(k, "ascending") for k in primary_key]
    data = pa.concat_tables([kept_data, upserts]).sort_by(order)
    state = pa.concat_tables([kept_state, new_state]).sort_by(order)
    return RangePatch(hidden, data, state, effective.num_rows)


def base_positions(base_keys: pa.Array, touched: pa.Array) -> np.ndarray:
    """The positions in a base file (sorted by key, each key once) of the `touched` keys it
    holds. A one-column integer key is binary-searched; other keys go through a hash set."""
    if pa.types.is_integer(base_keys.type) and base_keys.null_count == 0 and len(base_keys):
        keys = base_keys.to_numpy()
        wanted = touched.to_numpy(zero_copy_only=False)
        found = np.minimum(np.searchsorted(keys, wanted), len(keys) - 1)
        return np.unique(found[keys[found] == wanted]).astype(np.uint64)
    mask = pc.is_in(base_keys, value_set=touched)
    return np.asarray(pc.indices_nonzero(mask), dtype=np.uint64)
