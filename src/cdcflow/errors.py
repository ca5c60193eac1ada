"""One flat hierarchy of typed errors.

Every error message names the bad value and the rule it broke (ARCHITECTURE invariant 6).
Callers catch `CdcflowError` for anything raised by cdcflow.
"""

from __future__ import annotations


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
