"""pgoutput row messages into SourceChanges (EV-4, EV-6): keys apart from values, unchanged
TOAST values left out, a moved key as a DELETE and an INSERT, malformed rows refused."""

from __future__ import annotations

import pytest

from cdcflow.capture.postgres.changes import RelationShape, to_changes
from cdcflow.capture.postgres.connection import version_text
from cdcflow.capture.postgres.pgoutput import UNCHANGED, Delete, Insert, Update
from cdcflow.capture.postgres.types import text_converter
from cdcflow.errors import InvalidArgument
from cdcflow.model.records import ColumnTypeInfo
from cdcflow.model.source import lsn_number
from cdcflow.model.types import ColumnType

pytestmark = pytest.mark.unit

INT, TEXT = ColumnType("INT64"), ColumnType("STRING")


def shape(keys: tuple[str, ...] = ("id",)) -> RelationShape:
    """Columns note, id, region; the key is given, in its own order."""
    names = ("note", "id", "region")
    types = (TEXT, INT, INT)
    return RelationShape("public.t", names, tuple(text_converter(t) for t in types),
                         tuple(ColumnTypeInfo(n, t, n in keys, i) for i, (n, t)
                               in enumerate(zip(names, types, strict=True), start=1)), keys)


def test_an_insert_splits_keys_from_values_and_converts_text():
    (change,) = to_changes(shape(), Insert(1, ("hi", "7", None)), 0x10)
    assert (change.mod_type, change.keys, change.new_values) == (
        "INSERT", {"id": 7}, {"note": "hi", "region": None})
    assert change.position == {"lsn": "0/10"} and change.value_capture_type == "NEW_ROW"


def test_a_composite_key_keeps_the_key_order_not_the_column_order():
    (change,) = to_changes(shape(("region", "id")), Insert(1, ("x", "7", "3")), 1)
    assert list(change.keys) == ["region", "id"] and change.keys == {"region": 3, "id": 7}
    assert change.new_values == {"note": "x"}


def test_an_unchanged_toast_value_is_left_out_and_makes_new_values():
    (change,) = to_changes(shape(), Update(1, None, None, (UNCHANGED, "7", "2")), 1)
    assert change.new_values == {"region": 2}
    assert change.value_capture_type == "NEW_VALUES"


def test_under_replica_identity_full_the_old_row_fills_unchanged_values():
    (change,) = to_changes(shape(), Update(1, "O", ("old", "7", "1"), (UNCHANGED, "7", "2")),
                           1)
    assert change.new_values == {"note": "old", "region": 2}
    assert change.value_capture_type == "NEW_ROW"


def test_a_moved_key_is_a_delete_of_the_old_key_and_an_insert_of_the_new_row():
    gone, came = to_changes(shape(), Update(1, "K", (None, "7", None), ("n", "8", "1")), 0x20)
    assert (gone.mod_type, gone.keys) == ("DELETE", {"id": 7})
    assert (came.mod_type, came.keys, came.new_values) == ("INSERT", {"id": 8},
                                                           {"note": "n", "region": 1})
    assert came.position == {"lsn": "0/20", "moved_from": {"id": 7}, "part": 1}


def test_deletes_keep_old_values_only_under_replica_identity_full():
    (keyed,) = to_changes(shape(), Delete(1, "K", (None, "7", None)), 1)
    (full,) = to_changes(shape(), Delete(1, "O", ("a", "7", "4")), 1)
    assert (keyed.keys, keyed.old_values) == ({"id": 7}, {})
    assert (full.old_values, full.value_capture_type) == ({"note": "a", "region": 4},
                                                          "NEW_ROW_AND_OLD_VALUES")


@pytest.mark.parametrize(("message", "needle"), [
    (Insert(1, ("a", "7")), "has 2 columns, its relation 3"),
    (Insert(1, ("a", "7", "1", "9")), "has 4 columns, its relation 3"),
    (Update(1, None, None, ("a", UNCHANGED, "1")), "lacks a key column"),
])
def test_a_row_that_does_not_fit_its_relation_is_refused(message: Insert | Update,
                                                         needle: str):
    with pytest.raises(InvalidArgument, match=needle):
        to_changes(shape(), message, 1)


def test_lsns_sort_as_numbers_and_malformed_ones_are_refused():
    assert lsn_number("16/B374D848") == (0x16 << 32) | 0xB374D848
    assert lsn_number("0/10") < lsn_number("0/9A") < lsn_number("1/0")
    for bad in ["16/B374D848\n", "0x1/2", "1_0/2", " 1/2", "123456789/1", "1/", "/1", "1/2/3",
                "\uff11/2"]:
        with pytest.raises(InvalidArgument, match="is not of the form X/Y"):
            lsn_number(bad)


@pytest.mark.parametrize(("number", "text"), [(150004, "15.4"), (140000, "14.0"),
                                              (90624, "9.6.24"), (100023, "10.23")])
def test_server_version_numbers_read_as_postgresql_writes_them(number: int, text: str):
    """The refusal of a server older than 14 names its version as the server does."""
    assert version_text(number) == text
