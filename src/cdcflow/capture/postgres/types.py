"""PostgreSQL column types onto cdcflow's unified types, and their text values into the
record encoding (`cdcflow.model.types`). Pure.

Snapshots and the stream both read values as the types' text output (the backfill selects
`column::text`, pgoutput sends text), and the same converter turns them into values, so a
value is identical whichever way it arrives. Sessions run with TimeZone UTC; offsets in the
text are honoured anyway.

| PostgreSQL | unified |
|---|---|
| int2, int4, int8, oid | INT64 |
| float4, float8 (NaN, ±Infinity) | FLOAT64 |
| numeric(p, s) with p ≤ 38 | NUMERIC(p, s), exact |
| numeric unconstrained or wider | STRING (exact text), or the definition's NUMERIC(p, s) |
| bool | BOOL |
| date | DATE |
| timestamp, timestamptz | TIMESTAMP (a timestamp without zone is read as UTC) |
| json, jsonb | JSON |
| bytea | BYTES |
| text, varchar, char, name, uuid, time, enums and every other type | STRING (its text) |
| one-dimensional arrays of those | ARRAY |
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from cdcflow.errors import InvalidArgument
from cdcflow.model.timestamps import format_rfc3339
from cdcflow.model.types import ColumnType, encode_value, validate_value

_INTEGERS = {"int2", "int4", "int8", "oid"}
_FLOATS = {"float4", "float8"}
_MAX_PRECISION = 38


@dataclass(frozen=True, slots=True)
class PgType:
    """What the catalog says of a column's type: name, kind (`typtype`: b base, e enum, d
    domain...) and, for an array, its element's name."""

    name: str
    kind: str
    element: PgType | None = None


def numeric_of(type_modifier: int) -> tuple[int, int] | None:
    """(precision, scale) of a numeric's type modifier, or None when unconstrained."""
    if type_modifier < 4:
        return None
    packed = type_modifier - 4
    return (packed >> 16) & 0xFFFF, packed & 0xFFFF


def unified_type(pg_type: PgType, type_modifier: int,
                 numeric: tuple[int, int] | None = None) -> ColumnType:
    """The unified type of a column; `numeric` is a precision the definition gives an
    unconstrained or wide numeric."""
    if pg_type.element is not None:
        if pg_type.element.element is not None:
            raise InvalidArgument(f"type {pg_type.name} nests arrays; one dimension only")
        return ColumnType("ARRAY", element=unified_type(pg_type.element, type_modifier,
                                                        numeric))
    name = pg_type.name
    if name in _INTEGERS:
        return ColumnType("INT64")
    if name in _FLOATS:
        return ColumnType("FLOAT64")
    if name == "numeric":
        declared = numeric_of(type_modifier)
        chosen = declared if declared and declared[0] <= _MAX_PRECISION else numeric
        if chosen is None:
            return ColumnType("STRING")
        return ColumnType("NUMERIC", precision=chosen[0], scale=chosen[1])
    simple = {"bool": "BOOL", "date": "DATE", "timestamp": "TIMESTAMP",
              "timestamptz": "TIMESTAMP", "json": "JSON", "jsonb": "JSON", "bytea": "BYTES"}
    return ColumnType(simple.get(name, "STRING"))


def _parse_timestamp(text: str) -> datetime:
    outside = InvalidArgument(f"timestamp {text!r} is outside the years 1..9999 that cdcflow "
                              "keeps")
    if text.endswith(" BC") or text in ("infinity", "-infinity"):
        raise outside
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:  # PostgreSQL's years go to 294276
        raise outside from None
    if parsed.tzinfo is None:
        parsed = datetime.fromisoformat(text + "+00:00")
    return parsed


_UTC_TEXT = re.compile(
    r"([0-9]{4}-[0-9]{2}-[0-9]{2}) ([0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.([0-9]{1,6}))?(?:\+00)?")
"""PostgreSQL's text of a timestamp in UTC (the session's TimeZone; DateStyle ISO): the date, a
space, the time, up to 6 digits of a second, `+00` for a timestamptz."""


def _timestamp(text: str) -> str:
    """A timestamp's record encoding. Text in UTC is rewritten into it (a T for the space,
    the second's digits to 6, a Z), not parsed (the writer checks every value); anything else
    (another offset, BC, infinity, a year past 9999) is parsed."""
    match = _UTC_TEXT.fullmatch(text)
    if match is None:
        return format_rfc3339(_parse_timestamp(text))
    day, time, fraction = match.groups()
    return f"{day}T{time}.{(fraction or '').ljust(6, '0')}Z"


def _numeric(ctype: ColumnType) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            number = Decimal(text)
        except InvalidOperation:
            raise InvalidArgument(f"numeric {text!r} is not a number") from None
        return encode_value(validate_value(number, ctype, "numeric"), ctype)

    return convert


def _bytes(text: str) -> str:
    if not text.startswith("\\x"):
        raise InvalidArgument(f"bytea {text[:20]!r} is not in hex output (bytea_output=hex)")
    return base64.b64encode(bytes.fromhex(text[2:])).decode("ascii")


def _json(text: str) -> str:
    return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))


def _date(text: str) -> str:
    try:
        return date.fromisoformat(text).isoformat()
    except ValueError:
        raise InvalidArgument(f"date {text!r} is outside the years 1..9999 that cdcflow "
                              "keeps") from None


def scalar_converter(ctype: ColumnType) -> Callable[[str], Any]:
    """Text of one value -> its record encoding."""
    match ctype.code:
        case "INT64":
            return int
        case "FLOAT64":
            return lambda text: encode_value(float(text), ctype)  # NaN, Infinity as Python
        case "BOOL":
            return lambda text: text == "t"
        case "NUMERIC":
            return _numeric(ctype)
        case "DATE":
            return _date
        case "TIMESTAMP":
            return _timestamp
        case "JSON":
            return _json
        case "BYTES":
            return _bytes
        case _:
            return str


def text_converter(ctype: ColumnType) -> Callable[[str], Any]:
    """Text of a non-NULL value -> its record encoding, for any unified type."""
    if ctype.code == "ARRAY":
        assert ctype.element is not None
        element = scalar_converter(ctype.element)
        return lambda text: [None if item is None else element(item)
                             for item in parse_array(text)]
    return scalar_converter(ctype)


def converter(ctype: ColumnType) -> Callable[[str | None], Any]:
    """Text of a value (None: NULL) -> its record encoding, for any unified type."""
    convert = text_converter(ctype)
    return lambda text: None if text is None else convert(text)


def parse_array(text: str) -> list[str | None]:
    """The elements of a one-dimensional array literal, `{1,NULL,"a \\"b\\""}`, as text."""
    body = text.split("=", 1)[1] if text.startswith("[") else text  # [0:2]={...} bounds
    if not (body.startswith("{") and body.endswith("}")):
        raise InvalidArgument(f"array {text[:40]!r} is not an array literal")
    inner = body[1:-1]
    if inner.startswith("{"):
        raise InvalidArgument(f"array {text[:40]!r} has more than one dimension")
    items: list[str | None] = []
    at = 0
    while inner and at <= len(inner):
        item, at, quoted = _array_item(inner, at)
        items.append(None if not quoted and item == "NULL" else item)
        at += 1  # the comma
    return items


def _array_item(inner: str, at: int) -> tuple[str, int, bool]:
    if at < len(inner) and inner[at] == '"':
        chars, at = [], at + 1
        while inner[at] != '"':
            if inner[at] == "\\":
                at += 1
            chars.append(inner[at])
            at += 1
        return "".join(chars), at + 1, True
    end = inner.find(",", at)
    end = len(inner) if end < 0 else end
    return inner[at:end], end, False
