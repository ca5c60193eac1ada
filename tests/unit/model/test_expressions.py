"""Generated-column expressions in Spanner's dialect (issue 13, CW-3): FARM_FINGERPRINT
agrees with the values Spanner's and BigQuery's documentation give, MOD keeps the sign of
its dividend, NULLs propagate as in GoogleSQL, and bad text is a DdlError naming it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdcflow.errors import DdlError, InvalidArgument
from cdcflow.model.expressions import fingerprint, parse_expression

pytestmark = pytest.mark.unit

SHARD = "MOD(FARM_FINGERPRINT(CONCAT(FirstName, LastName)), 19)"


@pytest.mark.parametrize(("text", "expected"), [
    # the GoogleSQL hash-function page's example rows, CONCAT(CAST(x), y, CAST(z))
    ("1footrue", -1541654101129638711),
    ("2applefalse", 2794438866806483259),
    ("3true", -4880158226897771312),
    ("alphabet", -2427165924636348523),  # BigQuery's FARM_FINGERPRINT("alphabet")
])
def test_farm_fingerprint_agrees_with_the_documented_values(text: str, expected: int):
    assert fingerprint(text) == expected
    assert fingerprint(text.encode()) == expected
    assert parse_expression(f"FARM_FINGERPRINT('{text}')").evaluate({}) == expected


def test_the_seeds_shard_column_spreads_names_over_minus_18_to_18():
    shard = parse_expression(SHARD)
    values = {shard.evaluate({"FirstName": f"first{i}", "LastName": f"last{i}"})
              for i in range(2000)}
    assert values == set(range(-18, 19))  # MOD keeps the sign of the fingerprint
    value, hashed = shard.evaluate({"FirstName": "Alice", "LastName": "Trentor"}), \
        fingerprint("AliceTrentor")
    assert (hashed - value) % 19 == 0 and abs(value) < 19
    assert value == 0 or (value < 0) == (hashed < 0)
    assert shard.evaluate({"FirstName": None, "LastName": "x"}) is None
    assert shard.columns() == {"FirstName", "LastName"}


@given(st.integers(-2**63, 2**63 - 1), st.integers(1, 10**6))
def test_mod_has_the_sign_of_the_dividend(x: int, y: int):
    value = parse_expression(f"MOD({x}, {y})").evaluate({})
    assert abs(value) < y and (value == 0 or (value < 0) == (x < 0))
    assert (x - value) % y == 0


def test_processed_rows_leave_the_shard_column():
    text = f"CASE WHEN Processed THEN NULL ELSE {SHARD} END"
    shard = parse_expression(text)
    row = {"FirstName": "a", "LastName": "b"}
    assert shard.evaluate(row | {"Processed": True}) is None
    assert shard.evaluate(row | {"Processed": False}) == shard.evaluate(row | {
        "Processed": None}) == parse_expression(SHARD).evaluate(row)
    assert shard.columns() == {"Processed", "FirstName", "LastName"}


def test_coalesce_is_null_not_and_quoted_names():
    expression = parse_expression(
        "CASE WHEN `odd; name` IS NOT NULL THEN COALESCE(a, `odd; name`, 'none') "
        "WHEN NOT flag THEN 'off' ELSE \"other\" END")
    assert expression.evaluate({"odd; name": "x", "a": None}) == "x"
    assert expression.evaluate({"odd; name": "x", "a": "A"}) == "A"
    assert expression.evaluate({"flag": False}) == "off"
    assert expression.evaluate({"flag": None}) == "other"  # NOT NULL is NULL: not true
    assert parse_expression("CONCAT(a, NULL)").evaluate({"a": "x"}) is None
    assert parse_expression("concat(a, b)").evaluate({"a": b"x", "b": b"y"}) == b"xy"


@pytest.mark.parametrize(("text", "needle"), [
    ("MOD(a)", "MOD takes 2 arguments, not 1"),
    ("FARM_FINGERPRINT(a, b)", "FARM_FINGERPRINT takes 1 arguments, not 2"),
    ("SHA1(a)", "unknown function SHA1"),
    ("CASE a END", "expected WHEN"),
    ("CASE WHEN a THEN 1", "expected END"),
    ("MOD(a, 2", "expected ')' after the arguments"),
    ("a; DROP TABLE t", "unexpected text at '; DROP TABLE t'"),
    ("a b", "expected the end of the expression"),
    ("", "expected a value"),
])
def test_bad_expressions_are_ddl_errors_naming_the_text(text: str, needle: str):
    with pytest.raises(DdlError) as raised:
        parse_expression(text)
    assert needle in str(raised.value) and repr(text) in str(raised.value)


def test_bad_values_are_typed_errors():
    with pytest.raises(InvalidArgument, match=r"MOD\(7, 0\): division by zero"):
        parse_expression("MOD(a, 0)").evaluate({"a": 7})
    with pytest.raises(InvalidArgument, match="FARM_FINGERPRINT takes STRING or BYTES"):
        parse_expression("FARM_FINGERPRINT(a)").evaluate({"a": 5})
    with pytest.raises(InvalidArgument, match="not a mix"):
        parse_expression("CONCAT(a, b)").evaluate({"a": "x", "b": b"y"})
