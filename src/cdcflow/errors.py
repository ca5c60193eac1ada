"""One flat hierarchy of typed errors.

Every error message names the bad value and the rule it broke (ARCHITECTURE invariant 6).
Callers catch `CdcflowError` for anything raised by cdcflow.
"""

from __future__ import annotations

import reprlib


class CdcflowError(Exception):
    """Root of every error raised by cdcflow."""


class InvalidArgument(CdcflowError, ValueError):
    """A value, option or argument breaks a documented rule."""


class DdlError(InvalidArgument):
    """A DDL statement cannot be parsed or breaks a schema rule."""


class TypeMismatch(InvalidArgument):
    """A value does not fit the type of its column."""


class NotNullViolation(InvalidArgument):
    """NULL was written into a NOT NULL column."""


class NotFound(CdcflowError, LookupError):
    """A table, column, row, change stream, partition or shard does not exist."""


class AlreadyExists(CdcflowError):
    """The object or row to create exists already (e.g. a duplicate key on insert)."""


class OutOfRange(CdcflowError):
    """A timestamp or position lies outside the retained or valid range."""


class FailedPrecondition(CdcflowError):
    """The operation is valid in general but not in the current state."""


class Unavailable(CdcflowError):
    """A server cannot be reached or answered with a transient failure; a retry may succeed."""


class DataLoss(CdcflowError):
    """Stored data is damaged or missing: a checksum or a size does not match."""


class PositionLost(FailedPrecondition):
    """The source no longer holds a stored capture position (a purged binlog, say): the
    changes after it are gone, and reading on would skip them."""


class _Shown(reprlib.Repr):
    """`repr` bounded in length and depth; an int too long for `repr` shows its size."""

    def __init__(self) -> None:
        super().__init__()
        self.maxstring = self.maxother = 120
        self.maxlong = 60
        self.maxlevel = 4

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 10_000:
            return f"<int of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_SHOWN = _Shown()


def show(value: object) -> str:
    """A bad value as an error message names it: its repr, cut short when long. Never
    raises, so formatting a message cannot hide the error it reports."""
    try:
        return _SHOWN.repr(value)
    except Exception:  # a repr that fails: name the type instead
        return f"<{type(value).__name__}>"
