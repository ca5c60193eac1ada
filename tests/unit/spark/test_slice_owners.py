"""Keyed batches in whole partitions (issue 11: throughput): `slice_owners` gives each share
whole slices only when no partition starts or ends inside the batch, and only when the mods
the log counts per slice balance the shares."""

from __future__ import annotations

import pytest

from cdcflow.spark.keyed_batch import BALANCE, slice_owners
from cdcflow.spark.reading import ChangeSlice

pytestmark = pytest.mark.unit


def piece(token: str, after: int = 100, until: int = 200) -> ChangeSlice:
    return ChangeSlice("log.db", "S", token, after, until, None, 1000, False)


def test_stable_partitions_go_whole_to_the_least_loaded_share_largest_first():
    pieces = [piece("a"), piece("b"), piece("c"), piece("d")]
    owners = slice_owners(pieces, [40, 30, 20, 10], 2)
    assert owners == {"a": 0, "b": 1, "c": 1, "d": 0}  # loads 50 and 50
    owners = slice_owners(pieces, [10, 10, 10, 10], 3)
    assert owners is None  # 20 in one share against an even 13.3: past BALANCE
    owners = slice_owners([*pieces, piece("e"), piece("f")], [10] * 6, 3)
    assert owners is not None and sorted(owners.values()) == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("moved", [piece("b", after=150), piece("b", until=180)],
                         ids=["a partition starts inside the batch",
                              "a partition ends inside the batch"])
def test_a_partition_that_starts_or_ends_inside_the_batch_means_shares_by_key(
        moved: ChangeSlice):
    """A key routed to a parent and then to its child would be in two shares."""
    pieces = [piece("a"), moved, piece("c"), piece("d")]
    assert slice_owners(pieces, [10, 10, 10, 10], 2) is None


def test_uneven_partitions_uncounted_slices_and_one_share_mean_shares_by_key():
    pieces = [piece("a"), piece("b"), piece("c")]
    assert slice_owners(pieces, [90, 5, 5], 2) is None
    assert BALANCE == 1.15  # the boundary below: the largest share at most 57.5 of 100
    assert slice_owners(pieces, [57, 43, 0], 2) == {"a": 0, "b": 1, "c": 1}
    assert slice_owners(pieces, [58, 42, 0], 2) is None
    assert slice_owners(pieces, None, 2) is None
    assert slice_owners(pieces, [10, 10, 10], 1) is None
    assert slice_owners([piece("a")], [10], 2) is None  # one partition: nothing to share
