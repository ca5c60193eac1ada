"""The fold reads a key's row before the batch only when its first mod needs it (AP-4): a
whole-row UPDATE (every column of its `column_types` written) folds to the same rows whatever
that row was, so the table is not read for it. Checked against the fold given the row, on
mods hypothesis makes up."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cdcflow.model.records import ColumnTypeInfo
from cdcflow.model.types import parse_type
from cdcflow.table.fold import _Context, _fold_key, _needs_base

pytestmark = pytest.mark.property

CAPTURES = ["OLD_AND_NEW_VALUES", "NEW_ROW", "NEW_VALUES", "NEW_ROW_AND_OLD_VALUES"]
WIDE = [("Id", "INT64", True), ("A", "STRING(MAX)", False), ("B", "INT64", False),
        ("C", "STRING(MAX)", False)]
NARROW = WIDE[:3]  # C dropped by the source
VALUES = st.one_of(st.none(), st.integers(-5, 5).map(str), st.sampled_from(["x", "y", ""]))


def column_types(columns: list[tuple[str, str, bool]]) -> str:
    return json.dumps([ColumnTypeInfo(name, parse_type(kind), key, index + 1).to_dict()
                       for index, (name, kind, key) in enumerate(columns)])


@st.composite
def mods(draw: Any, kinds: tuple[str, ...] = ("INSERT", "UPDATE", "DELETE")) -> dict[str, Any]:
    columns = draw(st.sampled_from([WIDE, NARROW]))
    others = [name for name, _, key in columns if not key]
    kind, capture = draw(st.sampled_from(kinds)), draw(st.sampled_from(CAPTURES))
    whole = kind == "INSERT" or capture in ("NEW_ROW", "NEW_ROW_AND_OLD_VALUES")
    written = others if whole else draw(st.lists(st.sampled_from(others), unique=True))
    new = {} if kind == "DELETE" else {name: draw(VALUES) for name in written}
    old_names = others if draw(st.booleans()) else draw(
        st.lists(st.sampled_from(others), unique=True))
    return {"keys": json.dumps({"Id": "1"}), "new_values": json.dumps(new),
            "old_values": json.dumps({name: draw(VALUES) for name in old_names}),
            "column_types": column_types(columns), "mod_type": kind,
            "value_capture_type": capture, "source_metadata": "{}"}


BEFORE = st.one_of(st.none(), st.fixed_dictionaries(
    {"Id": st.just("1"), "A": VALUES, "B": VALUES, "C": VALUES, "D": VALUES}))


@given(mods(("UPDATE",)), st.lists(mods(), max_size=3), BEFORE)
@example({"keys": '{"Id": "1"}', "new_values": '{"A": "x", "B": "2", "C": "y"}',
          "old_values": "{}", "column_types": column_types(WIDE), "mod_type": "UPDATE",
          "value_capture_type": "OLD_AND_NEW_VALUES", "source_metadata": "{}"}, [],
         {"Id": "1", "A": "old", "B": "1", "C": "old", "D": "kept?"})
@settings(max_examples=500, deadline=None)
def test_a_key_first_updated_folds_the_same_without_the_row_it_does_not_need(
        first: dict[str, Any], rest: list[dict[str, Any]], before: dict[str, Any] | None):
    """The batch's first mod of the key is an UPDATE (whole or partial, of any capture
    type); any mods may follow it."""
    group = [first, *rest]
    columns = ["Id", "A", "B", "C", "D"]  # the table's; D was dropped before the batch
    given_row = {("1",): before} if before is not None else {}
    plain = _fold_key("T", group, _Context(["Id"], given_row, columns))
    needed = given_row if _needs_base(group) else {}
    fast = _fold_key("T", group, _Context(["Id"], needed, columns))
    assert (fast.rows, fast.final) == (plain.rows, plain.final)


def test_only_a_partial_update_of_a_key_needs_its_row():
    wide, narrow = column_types(WIDE), column_types(NARROW)
    update = {"keys": '{"Id": "1"}', "old_values": "{}", "mod_type": "UPDATE",
              "value_capture_type": "OLD_AND_NEW_VALUES", "source_metadata": "{}"}
    whole = update | {"new_values": '{"A": "x", "B": "1", "C": "y"}', "column_types": wide}
    assert not _needs_base([whole])
    assert _needs_base([update | {"new_values": '{"A": "x", "B": "1"}', "column_types": wide}])
    narrow_whole = update | {"new_values": '{"A": "x", "B": "1"}', "column_types": narrow}
    assert not _needs_base([narrow_whole])
    assert _needs_base([narrow_whole, whole])  # C is back by the key's last mod: it is kept
    assert _needs_base([update | {"new_values": '{"A": "x", "C": "1", "Id": "1"}',
                                  "column_types": wide}])  # as many names, but not B
