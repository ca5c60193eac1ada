"""Comparing two sides of an object (its source and a destination) with bounded memory.

Every row becomes canonical text: its key as the JSON list of its key values, its row as a
JSON object of the source's columns, each value in the record encoding (`encode_value`), so
that Python values from any source, Arrow values from a CDC table and JSON or Avro payloads
from event files compare alike. Keys fall into BUCKETS buckets by a hash of their text. A
first pass sums 64-bit row hashes per bucket on each side (order does not matter, so each
side is read in whatever order it has); only the buckets whose sums or counts differ are
read again, keeping their rows, to name the missing, extra and differing keys.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from cdcflow.capture.source import SourceObject
from cdcflow.model.types import encode_value

BUCKETS = 4096
SAMPLES = 10
DETAIL_ROWS = 500_000
"""Rows (both sides) each pass over the differing buckets keeps in memory, about."""
MAX_PASSES = 8
"""Passes over the differing buckets, at most; beyond them the counts are lower bounds."""
Canonical = tuple[str, str]
"""(key text, row text)."""


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def bucket_of(key: str) -> int:
    return _hash(key) % BUCKETS


class Canonicalizer:
    """Rows of one object as canonical (key text, row text)."""

    def __init__(self, item: SourceObject) -> None:
        self.keys = list(item.primary_key)
        self.columns = [(c.name, c.type) for c in item.columns]

    def of_values(self, row: dict[str, Any]) -> Canonical:
        """A row of Python values (a source's, a CDC table's, an Avro event's)."""
        encoded = {name: encode_value(row.get(name), ctype) for name, ctype in self.columns}
        return self.of_encoded(encoded)

    def of_json(self, payload: dict[str, Any]) -> Canonical:
        """A JSON event's payload: the record encoding, but INT64 values as text."""
        return self.of_encoded({name: _from_json(payload.get(name), ctype.code, ctype.element)
                                for name, ctype in self.columns})

    def of_encoded(self, encoded: dict[str, Any]) -> Canonical:
        """A row already in the record encoding (a JSON event's payload)."""
        row = {name: encoded.get(name) for name, _ in self.columns}
        key = json.dumps([row[k] for k in self.keys], separators=(",", ":"))
        return key, json.dumps(row, sort_keys=True, separators=(",", ":"))


def _from_json(value: Any, code: str, element: Any) -> Any:
    if code == "INT64" and isinstance(value, str):
        return int(value)
    if code == "ARRAY" and element is not None and element.code == "INT64" and \
            isinstance(value, list):
        return [int(v) if isinstance(v, str) else v for v in value]
    return value


@dataclass
class Digest:
    """Per bucket: how many rows, and the sum of their hashes modulo 2^64."""

    counts: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    sums: list[int] = field(default_factory=lambda: [0] * BUCKETS)

    def add(self, key: str, row: str) -> None:
        bucket = bucket_of(key)
        self.counts[bucket] += 1
        self.sums[bucket] = (self.sums[bucket] + _hash(row)) % 2**64

    @property
    def rows(self) -> int:
        return sum(self.counts)

    def differing(self, other: Digest) -> set[int]:
        return {b for b in range(BUCKETS) if self.counts[b] != other.counts[b] or
                self.sums[b] != other.sums[b]}


def digest(rows: Iterable[Canonical]) -> Digest:
    found = Digest()
    for key, row in rows:
        found.add(key, row)
    return found


def in_buckets(rows: Iterable[Canonical], buckets: set[int]) -> tuple[dict[str, str], list[str]]:
    """The rows of `rows` whose key falls in `buckets`, by key text, and the keys that came
    more than once."""
    found: dict[str, str] = {}
    again: list[str] = []
    for key, row in rows:
        if bucket_of(key) in buckets:
            if key in found:
                again.append(key)
            found[key] = row
    return found, again


@dataclass
class Difference:
    """How a destination differs from its source: counts and sample keys of each kind."""

    missing: int = 0
    extra: int = 0
    differ: int = 0
    duplicated: int = 0
    samples: dict[str, list[Any]] = field(
        default_factory=lambda: {"missing": [], "extra": [], "differ": [], "duplicated": []})
    buckets: int = 0
    """Key buckets whose digests differ."""
    partial: bool = False
    """Only the first MAX_PASSES passes of them were read row by row: the counts are lower
    bounds."""

    @property
    def equal(self) -> bool:
        return not (self.missing or self.extra or self.differ or self.duplicated or
                    self.buckets)

    def as_dict(self) -> dict[str, Any]:
        return {"equal": self.equal, "missing": self.missing, "extra": self.extra,
                "differ": self.differ, "duplicated": self.duplicated,
                "sample_keys": self.samples, "differing_buckets": self.buckets,
                "counts_are_lower_bounds": self.partial}


def compare(source: Callable[[], Iterator[Canonical]],
            destination: Callable[[], Iterator[Canonical]],
            source_digest: Digest | None = None) -> tuple[Digest, Digest, Difference]:
    """Digest both sides (each callable reads its side once more when called), then read
    the differing buckets again, in passes of about DETAIL_ROWS rows (at most MAX_PASSES),
    and name what differs there."""
    mine = source_digest or digest(source())
    theirs = digest(destination())
    differing = sorted(mine.differing(theirs))
    passes = _passes(differing, mine, theirs)
    found = Difference(buckets=len(differing), partial=len(passes) > MAX_PASSES)
    for buckets in passes[:MAX_PASSES]:
        expected, _ = in_buckets(source(), buckets)
        got, again = in_buckets(destination(), buckets)
        for kind, keys in (("missing", sorted(expected.keys() - got.keys())),
                           ("extra", sorted(got.keys() - expected.keys())),
                           ("differ", sorted(k for k in expected.keys() & got.keys()
                                             if expected[k] != got[k])),
                           ("duplicated", sorted(set(again)))):
            setattr(found, kind, getattr(found, kind) + len(keys))
            room = SAMPLES - len(found.samples[kind])
            found.samples[kind] += [json.loads(k) for k in keys[:room]]
    return mine, theirs, found


def _passes(buckets: list[int], mine: Digest, theirs: Digest) -> list[set[int]]:
    """The differing buckets in groups of about DETAIL_ROWS rows (from the digests' counts)."""
    passes: list[set[int]] = []
    rows = DETAIL_ROWS
    for bucket in buckets:
        size = mine.counts[bucket] + theirs.counts[bucket]
        if rows + size > DETAIL_ROWS and passes[-1:] != [set()]:
            passes.append(set())
            rows = 0
        passes[-1].add(bucket)
        rows += size
    return passes
