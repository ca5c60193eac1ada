"""Change-stream partitions (CS-2, CS-4, SH-5) as data, and the pure rules for split and merge.

A partition covers an immutable range of a 62-bit hash of (table, primary key) for a time span.
Hashing rather than raw key order spreads monotonically increasing keys (ids, timestamps) over
all partitions, so a split at the midpoint halves the load. Readers lose nothing: CS-3 gives no
order across partitions anyway, and all records of one key stay in exactly one partition per span.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from cdcflow.errors import FailedPrecondition, InvalidArgument
from cdcflow.model.schema import KEY_HASH_SPACE

ACTIVE: Final = "ACTIVE"
FINISHED: Final = "FINISHED"


@dataclass(frozen=True, slots=True)
class KeyRange:
    """Half-open range [start, end) of the key-hash space."""

    start: int
    end: int

    def contains(self, position: int) -> bool:
        return self.start <= position < self.end

    def midpoint(self) -> int:
        return self.start + (self.end - self.start) // 2


FULL_RANGE: Final = KeyRange(0, KEY_HASH_SPACE)


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    """A partition: token, key range, time span, lineage and state (ACTIVE or FINISHED).

    `record_count` is the number of records it holds: its data records, and its
    child-partitions record once it has ended (kept as records are written and expire)."""

    token: str
    key_range: KeyRange
    start_timestamp: datetime
    end_timestamp: datetime | None
    parent_tokens: tuple[str, ...]
    child_tokens: tuple[str, ...]
    state: str
    record_count: int


@dataclass(frozen=True, slots=True)
class PartitionPolicy:
    """When partitions split and merge on their own.

    A partition splits once it holds `split_records` records and there are fewer than
    `max_partitions` active ones. Two adjacent partitions merge when both are older than
    `merge_min_age_seconds` and each took fewer than `merge_max_records_per_second` on average,
    while more than `min_partitions` are active. The policy is checked at most once per
    `check_interval_seconds` per stream, inside a writer's commit.
    """

    auto: bool = True
    split_records: int = 20_000
    max_partitions: int = 16
    min_partitions: int = 1
    merge_max_records_per_second: float = 1.0
    merge_min_age_seconds: float = 60.0
    check_interval_seconds: float = 1.0

    def __post_init__(self) -> None:
        if self.split_records < 1:
            raise InvalidArgument(f"split_records {self.split_records} must be at least 1")
        if not 1 <= self.min_partitions <= self.max_partitions:
            raise InvalidArgument(
                f"min_partitions {self.min_partitions} and max_partitions {self.max_partitions} "
                "must satisfy 1 <= min_partitions <= max_partitions"
            )

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @staticmethod
    def from_json(data: dict[str, Any]) -> PartitionPolicy:
        return PartitionPolicy(**data)


def new_token(number: int) -> str:
    """A fresh opaque partition token; the random part keeps tokens unique across streams."""
    return f"P{number}-{secrets.token_hex(6)}"


def split_ranges(parent: KeyRange, at: int | None) -> tuple[KeyRange, KeyRange]:
    """The two child ranges of a split of `parent` at hash position `at` (default: midpoint)."""
    point = parent.midpoint() if at is None else at
    if not parent.start < point < parent.end:
        raise InvalidArgument(
            f"split point {point} must lie strictly inside the partition range "
            f"[{parent.start}, {parent.end})"
        )
    return KeyRange(parent.start, point), KeyRange(point, parent.end)


def merged_range(ranges: list[KeyRange]) -> KeyRange:
    """The range of a merge of exactly two adjacent ranges."""
    if len(ranges) != 2:
        raise InvalidArgument(f"a merge takes exactly 2 adjacent partitions, got {len(ranges)}")
    low, high = sorted(ranges, key=lambda r: r.start)
    if low.end != high.start:
        raise FailedPrecondition(
            f"partitions [{low.start}, {low.end}) and [{high.start}, {high.end}) are not "
            "adjacent; only neighbouring key ranges merge"
        )
    return KeyRange(low.start, high.end)
