"""Timestamps as integer microseconds since the Unix epoch, and their RFC 3339 text form."""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta

from cdcflow.errors import InvalidArgument, show

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MIN_MICROS = -62_135_596_800_000_000
"""0001-01-01T00:00:00Z, the earliest timestamp."""
MAX_MICROS = 253_402_300_799_999_999
"""9999-12-31T23:59:59.999999Z, the latest timestamp."""


def to_micros(ts: datetime) -> int:
    """Microseconds since the epoch of an aware datetime (naive values are rejected)."""
    if ts.tzinfo is None:
        raise InvalidArgument(f"timestamp {ts!r} has no timezone; pass an aware UTC datetime")
    delta = ts - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(micros: int) -> datetime:
    """The UTC datetime of `micros` microseconds since the epoch."""
    return _EPOCH + timedelta(microseconds=micros)


@functools.lru_cache(maxsize=512)
def minute_text(pattern: str, year: int, month: int, day: int, hour: int, minute: int) -> str:
    """`strftime(pattern)` of a minute given by its fields (a pattern of fields up to the
    minute): remembered, so that times of one minute are formatted once."""
    return datetime(year, month, day, hour, minute, tzinfo=UTC).strftime(pattern)


def format_rfc3339(ts: datetime | int) -> str:
    """`2022-09-27T12:30:00.123456Z`: microseconds always present, UTC as `Z`."""
    if isinstance(ts, int):
        ts = from_micros(ts)
    return _format_utc(ts)


@functools.lru_cache(maxsize=4096)
def _format_utc(ts: datetime) -> str:
    """Records of one transaction share their timestamps: each is formatted once. A value
    in `datetime.UTC` (as `from_micros` makes them) needs no conversion: its text ends in
    '+00:00', which becomes 'Z' (half the time of converting)."""
    if ts.tzinfo is UTC:
        return ts.isoformat(timespec="microseconds")[:-6] + "Z"
    return ts.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def parse_timestamp(text: str) -> datetime:
    """Parse RFC 3339 / ISO 8601 text (`Z` or an offset; a bare value counts as UTC)."""
    raw = text.strip()
    candidate = raw[:-1] + "+00:00" if raw.endswith(("Z", "z")) else raw
    candidate = candidate.replace(" ", "T", 1) if "T" not in candidate else candidate
    try:
        parsed = datetime.fromisoformat(candidate)
    except ValueError:
        raise InvalidArgument(
            f"timestamp {show(text)} is not RFC 3339 text such as '2022-09-27T12:30:00.123456Z'"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        raise _outside(show(text)) from None


def to_utc(ts: datetime) -> datetime:
    """An aware datetime in UTC; InvalidArgument when UTC has no such day (year 1 or 9999 with
    an offset that crosses the end of the calendar)."""
    try:
        return ts.astimezone(UTC)
    except OverflowError:
        raise _outside(repr(ts)) from None


def _outside(shown: str) -> InvalidArgument:
    return InvalidArgument(
        f"timestamp {shown} is outside the range of timestamps, 0001-01-01T00:00:00Z to "
        "9999-12-31T23:59:59.999999Z, once in UTC"
    )


def as_datetime(value: datetime | str) -> datetime:
    """Accept an aware datetime or RFC 3339 text; return an aware UTC datetime."""
    if isinstance(value, str):
        return parse_timestamp(value)
    if not isinstance(value, datetime):
        raise InvalidArgument(
            f"timestamp {show(value)} ({type(value).__name__}) is not a timestamp; pass an aware "
            "datetime or RFC 3339 text such as '2022-09-27T12:30:00.123456Z'"
        )
    if value.tzinfo is None:
        raise InvalidArgument(f"timestamp {value!r} has no timezone; pass an aware UTC datetime")
    return to_utc(value)
