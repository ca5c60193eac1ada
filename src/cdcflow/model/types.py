"""Column types of the embedded database, value validation and the JSON value encoding.

Values travel in change records and row storage in the Spanner JSON encoding:
INT64 and BOOL as JSON numbers/booleans, FLOAT64 as numbers (or "NaN", "Infinity", "-Infinity"),
BYTES as base64, DATE as "YYYY-MM-DD", TIMESTAMP as RFC 3339 with microseconds and `Z`,
NUMERIC as a decimal string, JSON as its canonical JSON text, ARRAY as a JSON list.
`column_types` in each record carries the type, so every value decodes without guessing.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from cdcflow.errors import InvalidArgument, TypeMismatch, show
from cdcflow.model.timestamps import format_rfc3339, parse_timestamp, to_utc

SCALAR_CODES: Final = frozenset(
    {"INT64", "FLOAT64", "BOOL", "STRING", "BYTES", "DATE", "TIMESTAMP", "NUMERIC", "JSON"}
)
MAX_STRING_LENGTH: Final = 2_621_440
MAX_BYTES_LENGTH: Final = 10_485_760
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
_NUMERIC_MAX_INTEGER_DIGITS: Final = 29
_NUMERIC_MAX_SCALE: Final = 9


class CommitTimestampPlaceholder:
    """Written into a TIMESTAMP column with allow_commit_timestamp; becomes the commit time."""

    _instance: CommitTimestampPlaceholder | None = None

    def __new__(cls) -> CommitTimestampPlaceholder:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "COMMIT_TIMESTAMP"


COMMIT_TIMESTAMP: Final = CommitTimestampPlaceholder()


@dataclass(frozen=True, slots=True)
class ColumnType:
    """A column type: a scalar code, a length for STRING/BYTES (None = MAX), an ARRAY
    element, or a NUMERIC's precision and scale (None: the default NUMERIC, 38 digits with
    9 after the point, as Spanner's)."""

    code: str
    length: int | None = None
    element: ColumnType | None = None
    precision: int | None = None
    scale: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The Spanner API type structure, e.g. {"code": "STRING"}; arrays nest their element;
        a NUMERIC with its own precision adds `precision` and `scale`."""
        if self.code == "ARRAY":
            assert self.element is not None
            return {"code": "ARRAY", "array_element_type": self.element.to_json()}
        if self.precision is not None:
            return {"code": self.code, "precision": self.precision, "scale": self.scale}
        return {"code": self.code}

    @staticmethod
    def from_json(data: dict[str, Any]) -> ColumnType:
        if data["code"] == "ARRAY":
            return ColumnType("ARRAY", element=ColumnType.from_json(data["array_element_type"]))
        return ColumnType(str(data["code"]), precision=data.get("precision"),
                          scale=data.get("scale"))

    @property
    def numeric_digits(self) -> tuple[int, int]:
        """(integer digits, fractional digits) a NUMERIC holds."""
        if self.precision is None:
            return _NUMERIC_MAX_INTEGER_DIGITS, _NUMERIC_MAX_SCALE
        return self.precision - (self.scale or 0), self.scale or 0

    def ddl(self) -> str:
        """The type as DDL text, e.g. STRING(MAX) or ARRAY<INT64>."""
        if self.code == "ARRAY":
            assert self.element is not None
            return f"ARRAY<{self.element.ddl()}>"
        if self.code in ("STRING", "BYTES"):
            return f"{self.code}({'MAX' if self.length is None else self.length})"
        if self.precision is not None:
            return f"{self.code}({self.precision}, {self.scale})"
        return self.code


def validate_value(value: Any, ctype: ColumnType, column: str) -> Any:
    """Check `value` against `ctype`; return it normalised (ints to float for FLOAT64, ...).

    None is returned as is: NOT NULL is the schema's rule, not the type's.
    """
    if value is None:
        return None
    if ctype.code == "ARRAY":
        if not isinstance(value, list | tuple):
            raise _mismatch(value, ctype, column)
        assert ctype.element is not None
        return [validate_value(v, ctype.element, column) for v in value]
    checker = _VALIDATORS[ctype.code]
    return checker(value, ctype, column)


def _mismatch(value: Any, ctype: ColumnType, column: str, rule: str = "") -> TypeMismatch:
    extra = f": {rule}" if rule else ""
    return TypeMismatch(
        f"value {show(value)} ({type(value).__name__}) does not fit column {column!r} "
        f"of type {ctype.ddl()}{extra}"
    )


def _check_int(value: Any, ctype: ColumnType, column: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _mismatch(value, ctype, column)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise _mismatch(value, ctype, column, "INT64 holds -2^63..2^63-1")
    return value


def _check_float(value: Any, ctype: ColumnType, column: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _mismatch(value, ctype, column)
    try:
        return float(value)
    except OverflowError:
        raise _mismatch(value, ctype, column, "it is outside the range of FLOAT64") from None


def _check_bool(value: Any, ctype: ColumnType, column: str) -> bool:
    if not isinstance(value, bool):
        raise _mismatch(value, ctype, column)
    return value


def _check_string(value: Any, ctype: ColumnType, column: str) -> str:
    if not isinstance(value, str):
        raise _mismatch(value, ctype, column)
    limit = ctype.length if ctype.length is not None else MAX_STRING_LENGTH
    if len(value) > limit:
        raise _mismatch(
            f"{value[:20]}...", ctype, column, f"{len(value)} characters exceed the limit {limit}"
        )
    if not is_valid_text(value):
        raise _mismatch(value, ctype, column, _SURROGATE_RULE)
    return value


_SURROGATE_RULE = "it holds a lone surrogate; text must be valid Unicode (UTF-8)"


def is_valid_text(text: str) -> bool:
    """Whether UTF-8, and so SQLite and JSON, can hold `text` (no lone surrogates)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_text(value: object, what: str) -> str:
    """`value` if it is valid text (a str that UTF-8 can hold); InvalidArgument naming it and
    `what` it is otherwise."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} {show(value)} ({type(value).__name__}) is not a string")
    if not is_valid_text(value):
        raise InvalidArgument(f"{what} {show(value)}: {_SURROGATE_RULE}")
    return value


def _check_bytes(value: Any, ctype: ColumnType, column: str) -> bytes:
    if not isinstance(value, bytes | bytearray):
        raise _mismatch(value, ctype, column)
    limit = ctype.length if ctype.length is not None else MAX_BYTES_LENGTH
    if len(value) > limit:
        raise _mismatch(value[:20], ctype, column, f"{len(value)} bytes exceed the limit {limit}")
    return bytes(value)


def _check_date(value: Any, ctype: ColumnType, column: str) -> date:
    if isinstance(value, datetime) or not isinstance(value, date):
        raise _mismatch(value, ctype, column, "pass a datetime.date")
    return value


def _check_timestamp(value: Any, ctype: ColumnType, column: str) -> datetime | Any:
    if value is COMMIT_TIMESTAMP:
        return value
    if not isinstance(value, datetime):
        raise _mismatch(value, ctype, column, "pass an aware datetime")
    if value.tzinfo is None:
        raise _mismatch(value, ctype, column, "the datetime needs a timezone (UTC)")
    try:
        utc = to_utc(value)
    except InvalidArgument:
        raise _mismatch(value, ctype, column, "in UTC it falls outside years 1 to 9999") from None
    return parse_timestamp(format_rfc3339(utc))


def _check_numeric(value: Any, ctype: ColumnType, column: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | str | Decimal):
        raise _mismatch(value, ctype, column, "pass a Decimal, int or decimal string")
    try:
        number = Decimal(value)
    except InvalidOperation:
        raise _mismatch(value, ctype, column, "not a decimal number") from None
    if not number.is_finite():
        raise _mismatch(value, ctype, column, "NUMERIC is finite")
    integer_digits, scale = _digits(number)
    most_integer, most_scale = ctype.numeric_digits
    if scale > most_scale:
        raise _mismatch(value, ctype, column, f"{ctype.ddl()} has at most {most_scale} "
                                              "fractional digits; cdcflow does not round")
    if integer_digits > most_integer:
        raise _mismatch(value, ctype, column, f"{ctype.ddl()} has at most {most_integer} "
                                              "integer digits")
    return number


def _digits(number: Decimal) -> tuple[int, int]:
    """(integer digits, fractional digits but trailing zeros) of a finite decimal, counted
    exactly: no context arithmetic, which rounds or raises past 28 digits."""
    _sign, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    significant = "".join(map(str, digits)).rstrip("0")
    if not significant:
        return 0, 0
    return max(0, len(digits) + exponent), max(0, len(significant) - len(digits) - exponent)


def _check_json(value: Any, ctype: ColumnType, column: str) -> Any:
    try:  # as `encode_value` writes it: sorted keys (mixed key types do not sort)
        json.dumps(value, allow_nan=False, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        raise _mismatch(value, ctype, column, "not serialisable as JSON") from None
    return value


_VALIDATORS: Final = {
    "INT64": _check_int,
    "FLOAT64": _check_float,
    "BOOL": _check_bool,
    "STRING": _check_string,
    "BYTES": _check_bytes,
    "DATE": _check_date,
    "TIMESTAMP": _check_timestamp,
    "NUMERIC": _check_numeric,
    "JSON": _check_json,
}


def quick_check(ctype: ColumnType) -> Callable[[Any], bool]:
    """A cheap test for encoded values of `ctype` that surely pass `decode_value` and
    `validate_value` (NULL, an int in range, a short enough str...). False means only "ask
    the full check", which gives the error."""
    code, length = ctype.code, ctype.length
    if code == "INT64":
        return lambda v: v is None or (type(v) is int and _INT64_MIN <= v <= _INT64_MAX)
    if code == "STRING":
        limit = length if length is not None else MAX_STRING_LENGTH
        return lambda v: v is None or (type(v) is str and len(v) <= limit
                                       and (v.isascii() or is_valid_text(v)))
    if code == "BOOL":
        return lambda v: v is None or type(v) is bool
    if code == "FLOAT64":
        return lambda v: v is None or type(v) is float
    if code == "TIMESTAMP":
        return _quick_timestamp
    return lambda v: v is None


def _quick_timestamp(value: Any) -> bool:
    """The record encoding's 27 characters (`2022-09-27T12:30:00.123456Z`) that Python reads
    as a time without a zone: `parse_timestamp` reads them too, as UTC."""
    if value is None:
        return True
    if (type(value) is not str or len(value) != 27 or value[26] != "Z" or value[10] != "T"
            or value[19] != "."):
        return False
    try:
        return datetime.fromisoformat(value[:26]).tzinfo is None
    except ValueError:
        return False


def encode_value(value: Any, ctype: ColumnType) -> Any:
    """A validated Python value in the JSON value encoding described in the module docstring."""
    if value is None:
        return None
    match ctype.code:
        case "ARRAY":
            assert ctype.element is not None
            return [encode_value(v, ctype.element) for v in value]
        case "FLOAT64":
            if math.isnan(value):
                return "NaN"
            if math.isinf(value):
                return "Infinity" if value > 0 else "-Infinity"
            return value
        case "BYTES":
            return base64.b64encode(value).decode("ascii")
        case "DATE":
            return value.isoformat()
        case "TIMESTAMP":
            return format_rfc3339(value)
        case "NUMERIC":
            return format(value, "f")
        case "JSON":
            return json.dumps(value, sort_keys=True, separators=(",", ":"))
        case _:
            return value


def decode_value(encoded: Any, ctype: ColumnType) -> Any:
    """The Python value of a JSON-encoded value of type `ctype` (inverse of `encode_value`)."""
    if encoded is None:
        return None
    match ctype.code:
        case "ARRAY":
            assert ctype.element is not None
            return [decode_value(v, ctype.element) for v in encoded]
        case "FLOAT64":
            return float(encoded)
        case "BYTES":
            return base64.b64decode(encoded)
        case "DATE":
            return date.fromisoformat(encoded)
        case "TIMESTAMP":
            return parse_timestamp(encoded)
        case "NUMERIC":
            return Decimal(encoded)
        case "JSON":
            return json.loads(encoded)
        case _:
            return encoded


def parse_type(text: str) -> ColumnType:
    """Parse DDL type text such as `STRING(MAX)`, `BYTES(16)`, `ARRAY<INT64>`."""
    raw = text.strip()
    upper = raw.upper()
    if upper.startswith("ARRAY<") and upper.endswith(">"):
        element = parse_type(raw[6:-1])
        if element.code == "ARRAY":
            raise InvalidArgument(f"type {text!r} nests arrays; ARRAY<ARRAY<...>> is not supported")
        return ColumnType("ARRAY", element=element)
    if upper.startswith(("STRING", "BYTES")):
        code = "STRING" if upper.startswith("STRING") else "BYTES"
        rest = upper[len(code) :].replace(" ", "")
        if not (rest.startswith("(") and rest.endswith(")")):
            raise InvalidArgument(f"type {text!r} needs a length: {code}(n) or {code}(MAX)")
        inner = rest[1:-1]
        if inner == "MAX":
            return ColumnType(code)
        if not (inner.isascii() and inner.isdigit()) or len(inner) > 9 or int(inner) < 1:
            raise InvalidArgument(f"type {text!r}: the length must be a positive integer or MAX")
        limit = MAX_STRING_LENGTH if code == "STRING" else MAX_BYTES_LENGTH
        if int(inner) > limit:
            raise InvalidArgument(f"type {text!r}: the length exceeds the maximum {limit}")
        return ColumnType(code, length=int(inner))
    if upper in SCALAR_CODES:
        return ColumnType(upper)
    raise InvalidArgument(
        f"unknown column type {text!r}; use one of INT64, FLOAT64, BOOL, STRING(n|MAX), "
        "BYTES(n|MAX), DATE, TIMESTAMP, NUMERIC, JSON, ARRAY<...>"
    )
