"""The merge rule of a CDC table: per key, the greatest (sequence, ingestion) wins; a DELETE
leaves a tombstone that beats older UPSERTs until its retention window ends (AP-4, AP-7).

One key range ("file") is merged at a time. Its rows and per-key state stay in Arrow; only the
keys that changes touch are handled in Python, so the Python work follows the changes and the
rest of the file is filtered and copied by Arrow.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

Key = tuple[Any, ...]
Order = tuple[str, int, int]  # (sequence sort key, ingest time ns, row index)
STATE_FIELDS = [("_seq_key", pa.string()), ("_ingest", pa.int64()), ("_row", pa.int64()),
                ("_deleted_at", pa.int64())]


@dataclass(slots=True)
class KeyState:
    """What the table remembers per key: the winning order, and a tombstone time if deleted."""

    order: Order
    deleted_at: int | None  # epoch micros of the apply that deleted the row


@dataclass(frozen=True, slots=True)
class Change:
    key: Key
    order: Order
    delete: bool
    row: dict[str, Any]


def key_array(table: pa.Table, primary_key: tuple[str, ...]) -> pa.Array:
    """One comparable value per row for its key (composite keys joined as text)."""
    if len(primary_key) == 1:
        return pa.chunked_array(table.column(primary_key[0])).combine_chunks()
    parts = [pc.cast(table.column(k), pa.string()) for k in primary_key]
    return pc.binary_join_element_wise(*parts, "\x1f").combine_chunks()


@dataclass(slots=True)
class FileContent:
    """One key range: Arrow rows and state, plus the Python overrides of touched keys."""

    schema: pa.Schema
    primary_key: tuple[str, ...]
    data: pa.Table
    state: pa.Table
    rows: dict[Key, dict[str, Any]] = field(default_factory=dict)
    touched: dict[Key, KeyState] = field(default_factory=dict)

    @staticmethod
    def empty(schema: pa.Schema, primary_key: tuple[str, ...]) -> FileContent:
        return FileContent(schema, primary_key, schema.empty_table(),
                           state_schema(schema, primary_key).empty_table())

    def _keys_table(self, keys: list[Key]) -> pa.Table:
        fields = [self.schema.field(k) for k in self.primary_key]
        columns = {k: [key[i] for key in keys] for i, k in enumerate(self.primary_key)}
        return pa.Table.from_pydict(columns, schema=pa.schema(fields))

    def known(self, keys: list[Key]) -> dict[Key, KeyState]:
        """State of these keys: touched overrides first, else the Arrow state."""
        result = {k: self.touched[k] for k in keys if k in self.touched}
        rest = [k for k in keys if k not in result]
        if rest and self.state.num_rows:
            mask = pc.is_in(key_array(self.state, self.primary_key),
                            value_set=key_array(self._keys_table(rest), self.primary_key))
            for row in self.state.filter(mask).to_pylist():
                key = tuple(row[k] for k in self.primary_key)
                result[key] = KeyState((row["_seq_key"], row["_ingest"], row["_row"]),
                                       row["_deleted_at"])
        return result

    def materialize(self, now_micros: int, retention_micros: int) -> tuple[pa.Table, pa.Table]:
        """Sorted (data, state) after the overrides; expired tombstones are dropped."""
        data, state = self.data, self.state
        if self.touched:
            touched = key_array(self._keys_table(list(self.touched)), self.primary_key)
            if data.num_rows:
                data = data.filter(pc.invert(pc.is_in(key_array(data, self.primary_key),
                                                      value_set=touched)))
            if state.num_rows:
                state = state.filter(pc.invert(pc.is_in(key_array(state, self.primary_key),
                                                        value_set=touched)))
            new_rows = pa.Table.from_pylist(list(self.rows.values()), schema=self.schema)
            data = pa.concat_tables([data.cast(self.schema), new_rows])
            new_state = [dict(zip(self.primary_key, k, strict=True)) | {
                "_seq_key": s.order[0], "_ingest": s.order[1], "_row": s.order[2],
                "_deleted_at": s.deleted_at} for k, s in self.touched.items()]
            target = state_schema(self.schema, self.primary_key)
            state = pa.concat_tables([state.cast(target),
                                      pa.Table.from_pylist(new_state, schema=target)])
        cutoff = now_micros - retention_micros
        expired = pc.and_kleene(pc.is_valid(state.column("_deleted_at")),
                                pc.less(state.column("_deleted_at"), cutoff))
        state = state.filter(pc.invert(pc.fill_null(expired, False)))
        order = [(k, "ascending") for k in self.primary_key]
        return data.sort_by(order), state.sort_by(order)


def state_schema(schema: pa.Schema, primary_key: tuple[str, ...]) -> pa.Schema:
    return pa.schema([schema.field(k) for k in primary_key]
                     + [pa.field(n, t) for n, t in STATE_FIELDS])


def winners(changes: list[Change]) -> dict[Key, Change]:
    """The greatest change per key; duplicates and arrival order don't matter."""
    best: dict[Key, Change] = {}
    for change in changes:
        current = best.get(change.key)
        if current is None or change.order > current.order:
            best[change.key] = change
    return best


def merge_into(content: FileContent, changes: list[Change], now_micros: int) -> int:
    """Apply winning changes to one range; return how many changed the table."""
    known = content.known([c.key for c in changes])
    applied = 0
    for change in changes:
        state = known.get(change.key)
        if state is not None and state.order >= change.order:
            continue
        applied += 1
        if change.delete:
            content.rows.pop(change.key, None)
            content.touched[change.key] = KeyState(change.order, now_micros)
        else:
            content.rows[change.key] = change.row
            content.touched[change.key] = KeyState(change.order, None)
    return applied


def assign(lows: list[Key], key: Key) -> int:
    """Index of the range holding `key`: the last range whose lowest key is <= key."""
    return max(0, bisect.bisect_right(lows, key) - 1)


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
