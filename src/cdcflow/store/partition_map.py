"""Partition lifecycle: initial partitions, split, merge, and the automatic policy's choices.

All functions run inside the caller's write transaction; the statements are in `store.log`. A
split or merge at timestamp T ends the parents at T (their records all have commit timestamps
< T), creates children starting at T, and appends one child-partitions record at T to every
parent's log (CS-9).
"""

from __future__ import annotations

import itertools
import json
import sqlite3

from cdcflow.errors import FailedPrecondition, InvalidArgument, NotFound
from cdcflow.model.partitions import (
    ACTIVE,
    FINISHED,
    KeyRange,
    PartitionMetadata,
    PartitionPolicy,
    merged_range,
    new_token,
    split_ranges,
)
from cdcflow.model.schema import KEY_HASH_SPACE
from cdcflow.model.timestamps import from_micros, to_micros
from cdcflow.store import log


def bump_version(conn: sqlite3.Connection) -> None:
    conn.execute("UPDATE _meta SET value = value + 1 WHERE key = 'partition_version'")


def _allocate_token(conn: sqlite3.Connection) -> str:
    conn.execute("UPDATE _meta SET value = value + 1 WHERE key = 'token_counter'")
    (number,) = conn.execute("SELECT value FROM _meta WHERE key = 'token_counter'").fetchone()
    return new_token(int(number))


def _insert(
    conn: sqlite3.Connection, stream: str, key_range: KeyRange, start: int, parents: list[str]
) -> str:
    token = _allocate_token(conn)
    log.insert_partition(conn, stream, token, (key_range.start, key_range.end), start, parents)
    return token


def create_initial(conn: sqlite3.Connection, stream: str, count: int, start: int) -> list[str]:
    """`count` partitions of equal width over the whole hash space, starting at `start`."""
    if count < 1:
        raise InvalidArgument(f"initial partition count {count} must be at least 1")
    bounds = [KEY_HASH_SPACE * i // count for i in range(count + 1)]
    tokens = [
        _insert(conn, stream, KeyRange(bounds[i], bounds[i + 1]), start, [])
        for i in range(count)
    ]
    bump_version(conn)
    return tokens


def _to_metadata(row: log.PartitionRow) -> PartitionMetadata:
    token, start, end, start_micros, end_micros, parents, children, records = row
    return PartitionMetadata(
        token=str(token),
        key_range=KeyRange(int(start), int(end)),
        start_timestamp=from_micros(int(start_micros)),
        end_timestamp=from_micros(end_micros) if isinstance(end_micros, int) else None,
        parent_tokens=tuple(json.loads(parents)),
        child_tokens=tuple(json.loads(children)),
        state=ACTIVE if end_micros is None else FINISHED,
        record_count=int(records),
    )


def all_partitions(conn: sqlite3.Connection, stream: str,
                   ending_after: int | None = None) -> list[PartitionMetadata]:
    return [_to_metadata(r) for r in log.all_partitions(conn, stream, ending_after)]


def active_partitions(conn: sqlite3.Connection, stream: str) -> list[PartitionMetadata]:
    return [_to_metadata(r) for r in log.active_partitions(conn, stream)]


def get_partition(conn: sqlite3.Connection, stream: str, token: str) -> PartitionMetadata:
    row = log.partition(conn, stream, token)
    if row is None:
        raise NotFound(f"partition token {token!r} does not exist in change stream {stream!r}")
    return _to_metadata(row)


def _require_active(conn: sqlite3.Connection, stream: str, token: str) -> PartitionMetadata:
    partition = get_partition(conn, stream, token)
    if partition.state != ACTIVE:
        raise FailedPrecondition(
            f"partition {token!r} of stream {stream!r} finished at "
            f"{partition.end_timestamp}; only active partitions split or merge"
        )
    return partition


def _finish(
    conn: sqlite3.Connection, stream: str, parents: list[str], children: list[str], at: int
) -> None:
    child_entries = [[child, log.partition_parents(conn, stream, child)] for child in children]
    body = json.dumps({"start_micros": at, "children": child_entries})
    for parent in parents:
        log.finish_partition(conn, stream, parent, at, children)
        log.insert_child_record(conn, stream, parent, at, body)
    bump_version(conn)


def split(
    conn: sqlite3.Connection, stream: str, token: str, at: int | None, micros: int
) -> tuple[str, str]:
    """End `token` at `micros` and start two children splitting its range at `at`."""
    parent = _require_active(conn, stream, token)
    low, high = split_ranges(parent.key_range, at)
    children = [_insert(conn, stream, r, micros, [token]) for r in (low, high)]
    _finish(conn, stream, [token], children, micros)
    return children[0], children[1]


def merge(conn: sqlite3.Connection, stream: str, tokens: list[str], micros: int) -> str:
    """End two adjacent active partitions at `micros` and start one child covering both."""
    if len(set(tokens)) != len(tokens):
        raise InvalidArgument(f"merge lists a partition twice: {tokens}")
    parents = [_require_active(conn, stream, t) for t in tokens]
    key_range = merged_range([p.key_range for p in parents])
    ordered = [p.token for p in sorted(parents, key=lambda p: p.key_range.start)]
    child = _insert(conn, stream, key_range, micros, ordered)
    _finish(conn, stream, ordered, [child], micros)
    return child


def split_candidates(
    active: list[PartitionMetadata], policy: PartitionPolicy
) -> list[PartitionMetadata]:
    """Partitions over the split threshold, largest first, within the partition cap."""
    room = policy.max_partitions - len(active)
    over = [p for p in active if p.record_count >= policy.split_records and p.key_range.end
            - p.key_range.start > 1]
    return sorted(over, key=lambda p: -p.record_count)[: max(0, room)]


def merge_candidate(
    active: list[PartitionMetadata], policy: PartitionPolicy, now_micros: int
) -> tuple[PartitionMetadata, PartitionMetadata] | None:
    """The first adjacent pair that is old enough and quiet enough to merge, if any."""
    if len(active) <= policy.min_partitions:
        return None

    def quiet(p: PartitionMetadata) -> bool:
        age = (now_micros - _micros(p)) / 1_000_000
        return age >= policy.merge_min_age_seconds and (
            p.record_count / age < policy.merge_max_records_per_second
        )

    for low, high in itertools.pairwise(active):
        if low.key_range.end == high.key_range.start and quiet(low) and quiet(high):
            return low, high
    return None


def _micros(p: PartitionMetadata) -> int:
    return to_micros(p.start_timestamp)
