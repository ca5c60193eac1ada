"""The digest comparison behind `cdcflow verify` (issue 14): bucket digests first, then rows
only in the differing buckets, in passes bounded by rows; exact counts and sample keys."""

from __future__ import annotations

import random

import pytest

from cdcflow.capture.source import SourceColumn, SourceObject
from cdcflow.model.types import parse_type
from cdcflow.streams import compare as module
from cdcflow.streams.compare import Canonicalizer, compare

ITEM = SourceObject("t", (SourceColumn("id", parse_type("INT64"), False, 1, 1),
                          SourceColumn("name", parse_type("STRING(MAX)"), True, None, 2),
                          SourceColumn("n", parse_type("INT64"), True, None, 3)))


def rows(count: int) -> list[dict]:
    return [{"id": i, "name": f"n{i}", "n": i * 2} for i in range(count)]


def sides(source: list[dict], destination: list[dict]):
    canon = Canonicalizer(ITEM)
    return (lambda: (canon.of_values(r) for r in source),
            lambda: (canon.of_values(r) for r in destination))


def test_equal_sides_in_any_order_have_no_difference():
    data = rows(2_000)
    shuffled = random.Random(1).sample(data, len(data))
    mine, theirs, found = compare(*sides(data, shuffled))
    assert found.equal and mine.rows == theirs.rows == 2_000


def test_missing_extra_differing_and_duplicated_rows_are_counted_and_named():
    data = rows(1_000)
    other = [r for r in data if r["id"] not in (3, 4)] + [{"id": 5000, "name": "x", "n": 1}]
    other[10] = other[10] | {"name": "changed"}
    other.append(dict(other[20]))
    _, _, found = compare(*sides(data, other))
    assert (found.missing, found.extra, found.differ, found.duplicated) == (2, 1, 1, 1)
    assert found.samples["missing"] == [[3], [4]] and found.samples["extra"] == [[5000]]
    assert found.samples["differ"] == [[other[10]["id"]]]
    assert not found.equal and not found.partial


def test_json_payloads_with_int64_as_text_compare_equal_to_python_values():
    canon = Canonicalizer(ITEM)
    assert canon.of_json({"id": "7", "name": "a", "n": "14"}) == canon.of_values(
        {"id": 7, "name": "a", "n": 14})


def test_many_differing_buckets_are_read_in_passes_and_beyond_the_limit_are_lower_bounds(
        monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(module, "DETAIL_ROWS", 100)
    data = rows(3_000)
    _, _, exact = compare(*sides(data, data[:2_000]))  # about 10 passes of 100 rows
    monkeypatch.setattr(module, "MAX_PASSES", 20)
    _, _, all_read = compare(*sides(data, data[:2_000]))
    assert all_read.missing == 1_000 and not all_read.partial
    assert exact.partial and 0 < exact.missing < 1_000 and len(exact.samples["missing"]) == 10
