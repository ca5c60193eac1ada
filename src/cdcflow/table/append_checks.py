"""Checks of an append's rows that Arrow's conversions do not make: column names, values a
conversion would cut short, key columns (present, not NULL, not NaN) and app versions. Each
failure is InvalidArgument naming the row, the value or column, and the rule."""

from __future__ import annotations

import math
import numbers
from collections import Counter
from datetime import datetime, time
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.errors import InvalidArgument


def check_names(names: list[Any]) -> None:
    """The columns of an append are named with text, each once."""
    for name in names:
        if not isinstance(name, str):
            raise InvalidArgument(f"column name {name!r} is not a string; columns are named "
                                  "with text")
    repeated = sorted(name for name, count in Counter(names).items() if count > 1)
    if repeated:
        raise InvalidArgument(f"columns {repeated} appear more than once in the append; give "
                              "each column once")


def check_text(values: list[Any], name: str) -> None:
    """_CHANGE_TYPE and _CHANGE_SEQUENCE_NUMBER are STRING: bytes are not read as text (as
    they are not in an Arrow table's binary column either)."""
    for row, value in enumerate(values):
        if value is not None and not isinstance(value, str):
            raise InvalidArgument(f"row {row}: {name} {value!r} is not a STRING; give it as "
                                  "text")


def check_exact(values: list[Any], field: pa.Field) -> None:
    """Python values that Arrow would convert only by cutting them short are refused: a
    fraction into an integer, a timestamp or a date, a time of day into a date, text into an
    array."""
    kind = field.type
    if not (pa.types.is_integer(kind) or pa.types.is_timestamp(kind)
            or pa.types.is_date(kind) or pa.types.is_list(kind)):
        return
    for row, value in enumerate(values):
        if value is not None and _inexact(value, kind):
            raise InvalidArgument(
                f"row {row}: value {value!r} does not fit column {field.name!r} of type "
                f"{kind} exactly (it would be cut short); nothing of this append was written")


def _inexact(value: Any, kind: pa.DataType) -> bool:
    if pa.types.is_list(kind):
        return isinstance(value, str | bytes | bytearray) or (
            isinstance(value, list | tuple) and any(
                v is not None and _inexact(v, kind.value_type) for v in value))
    if pa.types.is_date(kind) and isinstance(value, datetime):
        return value.time() != time()
    if isinstance(value, float) and math.isfinite(value):
        return value != int(value)
    if isinstance(value, Decimal) and value.is_finite():
        return value != value.to_integral_value()
    return False


def check_keys(data: pa.Table, primary_key: tuple[str, ...]) -> None:
    """AP-2: every row of an append has its key columns, and none is NULL."""
    for key in primary_key:
        if not data.num_rows:
            return
        bad = 0 if key not in data.column_names else (
            data.column(key).to_pylist().index(None) if data.column(key).null_count else None)
        if bad is not None:
            raise InvalidArgument(
                f"row {bad}: primary key column {key!r} is NULL or missing; key columns can't "
                "be NULL (AP-2)"
            )


def key_values(column: Any, field: pa.Field) -> Any:
    """A floating-point key column with -0.0 as 0.0 (one key, as they are equal); NaN is
    refused, as it equals no key, itself included."""
    if not pa.types.is_floating(field.type):
        return column
    nan = pc.fill_null(pc.is_nan(column), False)
    if pc.any(nan).as_py():
        row = nan.to_pylist().index(True)
        raise InvalidArgument(f"row {row}: primary key column {field.name!r} is NaN; a key "
                              "value must equal itself (AP-2)")
    return pc.if_else(pc.equal(column, 0), pa.scalar(0, field.type), column)


def checked_version(app_id: Any, version: Any) -> int:
    """An append's (app_id, version): a non-empty text and an integer in 0..2^63-1 (a Delta
    app transaction's version is a signed 64-bit number)."""
    if not isinstance(app_id, str) or not app_id:
        raise InvalidArgument(f"app_id {app_id!r} must be a non-empty string")
    if isinstance(version, bool) or not isinstance(version, numbers.Integral) or \
            not 0 <= int(version) < 2**63:
        raise InvalidArgument(f"version {version!r} must be a non-negative integer below 2^63")
    return int(version)
