"""Offsets of the streaming source and the pure rules that plan a micro-batch.

An offset is one global timestamp T plus the lineage frontier at T: every record with
commit_timestamp <= T has been consumed from every partition, and the frontier lists the
partitions that hold the records after T. Because the database's safe time is global (CS-8),
all partitions are complete up to T at once, so every transaction (one commit timestamp) lands
in exactly one batch. A batch never crosses the end of a frontier partition: it stops just
before, so children enter a later batch, after every parent was read to its end (CS-4, SH-5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cdcflow.errors import InvalidArgument
from cdcflow.model.partitions import PartitionMetadata
from cdcflow.model.timestamps import format_rfc3339, to_micros

OFFSET_VERSION = 1


@dataclass(frozen=True, slots=True)
class StreamOffset:
    """All records with commit micros <= `timestamp` consumed; `frontier` reads next."""

    timestamp: int
    frontier: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": OFFSET_VERSION,
            "timestamp": self.timestamp,
            "timestamp_text": format_rfc3339(max(self.timestamp, 0)),
            "partitions": {token: {"read_to": self.timestamp} for token in self.frontier},
        }

    @staticmethod
    def from_dict(data: Any) -> StreamOffset:
        """An offset back from a checkpoint; anything else (an offset edited by hand, say)
        is InvalidArgument naming the value and what an offset holds."""
        if not isinstance(data, dict):
            raise InvalidArgument(f"offset {str(data)[:200]!r} is not a JSON object; a cdcflow "
                                  "offset holds version, timestamp and partitions")
        version = data.get("version")
        if version != OFFSET_VERSION:
            raise InvalidArgument(
                f"offset version {version!r} is not supported; this cdcflow reads version "
                f"{OFFSET_VERSION} (start the query from a new checkpoint)"
            )
        timestamp, partitions = data.get("timestamp"), data.get("partitions")
        if not isinstance(timestamp, int) or isinstance(timestamp, bool) or timestamp < -1:
            raise InvalidArgument(f"offset timestamp {timestamp!r} is not a commit time in "
                                  "microseconds (an integer, -1 before the first record)")
        if not isinstance(partitions, dict) or not all(isinstance(t, str) for t in partitions):
            raise InvalidArgument(f"offset partitions {str(partitions)[:200]!r} is not an "
                                  "object keyed by partition token")
        return StreamOffset(timestamp, tuple(sorted(partitions)))


def _micros(value: Any) -> int:
    return to_micros(value)


def frontier_at(partitions: list[PartitionMetadata], consumed: int) -> tuple[str, ...]:
    """Tokens whose records come next after `consumed`: the span contains consumed + 1."""
    following = consumed + 1
    return tuple(sorted(
        p.token
        for p in partitions
        if _micros(p.start_timestamp) <= following
        and (p.end_timestamp is None or _micros(p.end_timestamp) > following)
    ))


def batch_end(partitions: list[PartitionMetadata], start: StreamOffset, safe: int) -> int:
    """The end of the next batch: at most the safe time, and before any frontier partition
    ends (so its children wait for the next batch)."""
    ends = [
        _micros(p.end_timestamp) - 1
        for p in partitions
        if p.token in start.frontier and p.end_timestamp is not None
    ]
    return min([safe, *ends])


def admit(counts: list[tuple[int, int]], start: int, end: int, max_rows: int) -> int:
    """Cap a batch (start, end] at about `max_rows` mods without splitting a transaction.

    `counts` holds (commit micros, mods) of records in the range, any order. The batch ends
    at the last commit timestamp whose cumulative mods fit; the first timestamp is always
    admitted whole, however large.
    """
    if max_rows < 1:
        raise InvalidArgument(f"maxRecordsPerTrigger {max_rows} must be at least 1")
    per_timestamp: dict[int, int] = {}
    for micros, mods in counts:
        if start < micros <= end:
            per_timestamp[micros] = per_timestamp.get(micros, 0) + mods
    total = 0
    admitted = start
    for micros in sorted(per_timestamp):
        total += per_timestamp[micros]
        if total > max_rows and admitted > start:
            return admitted
        admitted = micros
        if total >= max_rows:
            return admitted
    return end
