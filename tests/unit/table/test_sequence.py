"""AP-4: _CHANGE_SEQUENCE_NUMBER format and comparison."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from cdcflow.errors import InvalidArgument
from cdcflow.table import ChangeSequenceNumber as Seq

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("greater", "smaller"), [
    ("7B", "77"), ("FFF/ABC", "FFF/B"), ("ABC", "BA/FFFFFFFF"), ("FFF/ABC", "ABC"),
    ("abc", "ABB"), ("1/0", "1"), ("0/0/0/1", "0/0/0/0"),
])
def test_seed_comparisons_and_more(greater: str, smaller: str):
    assert Seq.parse(greater) > Seq.parse(smaller)
    assert Seq.parse(greater).sort_key > Seq.parse(smaller).sort_key


def test_case_does_not_matter_and_equal_values_are_equal():
    assert Seq.parse("ff/0a") == Seq.parse("FF/A")
    assert str(Seq.parse("ff/0a")) == "FF/A"


VALID = ["0/0/0/0", "FFFFFFFFFFFFFFFF/FFFFFFFFFFFFFFFF/FFFFFFFFFFFFFFFF/FFFFFFFFFFFFFFFF", "0",
         "1234567890abcdef"]
INVALID = ["0/0/0/0/0", "1FFFFFFFFFFFFFFFF", "", "A//B", "/A", "A/", "XYZ", "12 34", "0x1F",
           "-1"]


@pytest.mark.parametrize("text", VALID)
def test_boundaries_accepted(text: str):
    assert Seq.parse(text).sections


@pytest.mark.parametrize("text", INVALID)
def test_malformed_rejected_with_the_rule(text: str):
    with pytest.raises(InvalidArgument) as caught:
        Seq.parse(text)
    assert repr(text) in str(caught.value) and "1 to 4 sections" in str(caught.value)


def test_encodings():
    assert str(Seq.from_timestamp(datetime(2024, 4, 30, 11, 19, 44, tzinfo=UTC))) == "18F2EBB6480"
    assert str(Seq.from_ints(255, 1)) == "FF/1"
    with pytest.raises(InvalidArgument):
        Seq.from_ints(1, 2, 3, 4, 5)
    with pytest.raises(InvalidArgument):
        Seq.from_ints(2**64)
    with pytest.raises(InvalidArgument, match="not a STRING"):
        Seq.parse(12)
