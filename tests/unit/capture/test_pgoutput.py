"""The pgoutput decoder and PostgreSQL's text values, on bytes built by the protocol's
definitions (the integration tests decode a real server's stream)."""

from __future__ import annotations

import struct

import pytest

from cdcflow.capture.postgres import pgoutput
from cdcflow.capture.postgres.types import (
    PgType,
    converter,
    numeric_of,
    parse_array,
    unified_type,
)
from cdcflow.errors import InvalidArgument, TypeMismatch
from cdcflow.model.types import ColumnType

pytestmark = pytest.mark.unit


def text(*values: str | None) -> bytes:
    out = struct.pack("!H", len(values))
    for value in values:
        if value is None:
            out += b"n"
        elif value == "<u>":
            out += b"u"
        else:
            data = value.encode()
            out += b"t" + struct.pack("!i", len(data)) + data
    return out


def test_begin_commit_relation_and_rows():
    begin = pgoutput.decode(b"B" + struct.pack("!QqI", 0x1_0000_0010, 5, 742))
    assert begin == pgoutput.Begin(0x1_0000_0010, pgoutput.PG_EPOCH_MICROS + 5, 742)
    commit = pgoutput.decode(b"C" + struct.pack("!BQQq", 0, 16, 24, 7))
    assert commit == pgoutput.Commit(0, 16, 24, pgoutput.PG_EPOCH_MICROS + 7)
    relation = pgoutput.decode(
        b"R" + struct.pack("!I", 7) + b"public\0accounts\0d" + struct.pack("!H", 2)
        + b"\1id\0" + struct.pack("!Ii", 23, -1) + b"\0note\0" + struct.pack("!Ii", 25, -1))
    assert relation == pgoutput.Relation(7, "public", "accounts", "d", (
        pgoutput.RelationColumn(True, "id", 23, -1),
        pgoutput.RelationColumn(False, "note", 25, -1)))
    insert = pgoutput.decode(b"I" + struct.pack("!I", 7) + b"N" + text("1", None))
    assert insert == pgoutput.Insert(7, ("1", None))
    update = pgoutput.decode(b"U" + struct.pack("!I", 7) + b"K" + text("1", None) + b"N"
                             + text("2", "<u>"))
    assert update == pgoutput.Update(7, "K", ("1", None), ("2", pgoutput.UNCHANGED))
    delete = pgoutput.decode(b"D" + struct.pack("!I", 7) + b"O" + text("2", "x"))
    assert delete == pgoutput.Delete(7, "O", ("2", "x"))
    truncate = pgoutput.decode(b"T" + struct.pack("!IBII", 2, 3, 7, 8))
    assert truncate == pgoutput.Truncate((7, 8), True, True)
    message = pgoutput.decode(b"M" + struct.pack("!BQ", 0, 99) + b"cdcflow\0"
                              + struct.pack("!I", 2) + b"hi")
    assert message == pgoutput.Message(False, 99, "cdcflow", b"hi")
    assert pgoutput.lsn_text(0x16_B374D848) == "16/B374D848"


@pytest.mark.parametrize(("payload", "needle"), [
    (b"", "empty"), (b"Z", "kind 'Z'"), (b"B\0\0", "ends early"),
    (b"R" + struct.pack("!I", 7) + b"public", "unterminated"),
    (b"I" + struct.pack("!I", 7) + b"X", "part 'X'"),
    (b"I" + struct.pack("!I", 7) + b"N" + struct.pack("!H", 1) + b"b", "kind 'b'"),
])
def test_malformed_messages_are_typed_errors(payload: bytes, needle: str):
    with pytest.raises(InvalidArgument, match=needle):
        pgoutput.decode(payload)


def test_types_and_text_values():
    assert numeric_of(-1) is None and numeric_of((12 << 16 | 2) + 4) == (12, 2)
    assert unified_type(PgType("numeric", "b"), (12 << 16 | 2) + 4) == ColumnType(
        "NUMERIC", precision=12, scale=2)
    assert unified_type(PgType("numeric", "b"), -1) == ColumnType("STRING")
    assert unified_type(PgType("numeric", "b"), -1, (38, 10)).precision == 38
    assert unified_type(PgType("mood", "e"), -1) == ColumnType("STRING")
    array = unified_type(PgType("_int4", "b", PgType("int4", "b")), -1)
    assert array == ColumnType("ARRAY", element=ColumnType("INT64"))
    assert converter(array)("{1,NULL,3}") == [1, None, 3]
    assert parse_array('{"a b","c\\"d",NULL,"NULL"}') == ["a b", 'c"d', None, "NULL"]
    assert parse_array("[0:1]={x,y}") == ["x", "y"] and parse_array("{}") == []
    with pytest.raises(InvalidArgument, match="more than one dimension"):
        parse_array("{{1,2},{3,4}}")
    stamp = converter(ColumnType("TIMESTAMP"))
    assert stamp("2026-01-01 12:00:00.5+05:30") == "2026-01-01T06:30:00.500000Z"
    assert stamp("2026-01-01 12:00:00") == "2026-01-01T12:00:00.000000Z"
    with pytest.raises(InvalidArgument, match=r"1\.\.9999"):
        stamp("infinity")
    floats = converter(ColumnType("FLOAT64"))
    assert [floats(v) for v in ("NaN", "Infinity", "-Infinity", "1.5")] == [
        "NaN", "Infinity", "-Infinity", 1.5]
    assert converter(ColumnType("BYTES"))("\\x0102") == "AQI="
    assert converter(ColumnType("JSON"))('{"b": 1, "a": [1, 2]}') == '{"a":[1,2],"b":1}'
    exact = converter(ColumnType("NUMERIC", precision=12, scale=2))
    assert exact("1234567890.25") == "1234567890.25"
    with pytest.raises(InvalidArgument, match="does not round"):
        exact("1.255")
    with pytest.raises(InvalidArgument, match=r"not a number|finite"):
        exact("NaN")


def test_a_numeric_that_does_not_fit_the_given_precision_is_refused_not_rounded():
    exact = converter(ColumnType("NUMERIC", precision=10, scale=2))
    assert exact("12345678.91") == "12345678.91"
    for too_fine, rule in (("123.456", "at most 2 fractional digits"),
                           ("123456789.5", "at most 8 integer digits")):
        with pytest.raises(TypeMismatch, match=rule):
            exact(too_fine)
