"""The merge rule of a CDC table, pure: per key, the greatest (sequence, ingestion) wins;
a DELETE leaves a tombstone that beats older UPSERTs until its retention window ends (AP-4,
AP-7). Works on one key range ("file") at a time, so cost follows the touched ranges.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

Key = tuple[Any, ...]
Order = tuple[str, int, int]  # (sequence sort key, ingest time ns, row index)


@dataclass(slots=True)
class KeyState:
    """What the table remembers per key: the winning order, and a tombstone time if deleted."""

    order: Order
    deleted_at: int | None  # epoch micros of the apply that deleted the row


@dataclass(slots=True)
class FileContent:
    """One key range of the baseline: live rows and per-key state (tombstones included)."""

    rows: dict[Key, dict[str, Any]] = field(default_factory=dict)
    state: dict[Key, KeyState] = field(default_factory=dict)

    def lowest_key(self) -> Key | None:
        return min(self.state) if self.state else None


@dataclass(frozen=True, slots=True)
class Change:
    key: Key
    order: Order
    delete: bool
    row: dict[str, Any]


def winners(changes: list[Change]) -> dict[Key, Change]:
    """The greatest change per key; duplicates and arrival order don't matter."""
    best: dict[Key, Change] = {}
    for change in changes:
        current = best.get(change.key)
        if current is None or change.order > current.order:
            best[change.key] = change
    return best


def merge_into(content: FileContent, changes: list[Change], now_micros: int,
               retention_micros: int) -> int:
    """Apply winning changes to one range; return how many changed the table."""
    applied = 0
    for change in changes:
        known = content.state.get(change.key)
        if known is not None and known.order >= change.order:
            continue
        applied += 1
        if change.delete:
            content.rows.pop(change.key, None)
            content.state[change.key] = KeyState(change.order, now_micros)
        else:
            content.rows[change.key] = change.row
            content.state[change.key] = KeyState(change.order, None)
    expired = [k for k, s in content.state.items()
               if s.deleted_at is not None and s.deleted_at < now_micros - retention_micros]
    for key in expired:
        del content.state[key]
    return applied


def assign(lows: list[Key], key: Key) -> int:
    """Index of the range holding `key`: the last range whose lowest key is <= key."""
    return max(0, bisect.bisect_right(lows, key) - 1)


def split(content: FileContent, target_rows: int) -> list[FileContent]:
    """Split a range that grew past twice the target into ranges of about the target size."""
    if len(content.state) <= 2 * target_rows:
        return [content]
    keys = sorted(content.state)
    pieces = []
    for start in range(0, len(keys), target_rows):
        chunk = keys[start:start + target_rows]
        pieces.append(FileContent(
            {k: content.rows[k] for k in chunk if k in content.rows},
            {k: content.state[k] for k in chunk},
        ))
    return pieces
