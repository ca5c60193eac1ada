"""Connections to PostgreSQL: the password from the environment only, sessions in UTC, and
server errors turned into typed errors that name what is missing and never the password."""

from __future__ import annotations

import os
import re
from typing import Any

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import psycopg2.extras

from cdcflow.errors import (
    CdcflowError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
)

_SESSION = "-c TimeZone=UTC -c client_encoding=UTF8 -c DateStyle=ISO -c bytea_output=hex " \
    "-c extra_float_digits=1 -c IntervalStyle=postgres"


def check_dsn(dsn: str) -> str:
    """A DSN may not carry a password: it would be stored in the catalog."""
    if re.search(r"(^|\s)password\s*=", dsn) or re.match(r"postgres(ql)?://[^/@]*:[^/@]*@",
                                                         dsn):
        raise InvalidArgument("the dsn holds a password; give it in the environment instead "
                              "(password_env, PGPASSWORD or PGPASSFILE)")
    try:
        psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError as error:
        raise InvalidArgument(f"dsn is not libpq keywords or a postgresql:// URL: "
                              f"{str(error).strip()}") from None
    return dsn


def describe_dsn(dsn: str) -> str:
    """host:port/dbname as user, for messages."""
    return f"{database_of(dsn)} as {psycopg2.extensions.parse_dsn(dsn).get('user', '?')}"


def server_of(dsn: str) -> str:
    """host:port, as the DSN writes them (libpq's defaults where it says nothing)."""
    parts = psycopg2.extensions.parse_dsn(dsn)
    return f"{parts.get('host', 'localhost')}:{parts.get('port', 5432)}"


def database_of(dsn: str) -> str:
    """host:port/dbname, as the DSN writes them."""
    return f"{server_of(dsn)}/{psycopg2.extensions.parse_dsn(dsn).get('dbname', '?')}"


def connect(dsn: str, password_env: str | None, replication: bool = False) -> Any:
    """A connection (autocommit) or a logical replication connection."""
    kwargs: dict[str, Any] = {"options": _SESSION, "application_name": "cdcflow"}
    if password_env is not None:
        if password_env not in os.environ:
            raise FailedPrecondition(f"environment variable {password_env!r} (password_env) "
                                     "is not set")
        kwargs["password"] = os.environ[password_env]
    if replication:
        kwargs["connection_factory"] = psycopg2.extras.LogicalReplicationConnection
    try:
        conn = psycopg2.connect(check_dsn(dsn), **kwargs)
    except psycopg2.Error as error:
        raise typed(error, f"cannot connect to PostgreSQL at {describe_dsn(dsn)}") from None
    if not replication:
        conn.autocommit = True
    return conn


_PRIVILEGES = {
    "replication slot": "the REPLICATION attribute (ALTER ROLE ... REPLICATION)",
    "publication": "CREATE on the database, and ownership of the published tables",
}


def typed(error: BaseException, doing: str) -> CdcflowError:
    """A psycopg2 error as a cdcflow error: what was being done and what the server said."""
    said = " ".join(str(getattr(error, "pgerror", None) or error).split())
    if isinstance(error, psycopg2.errors.InsufficientPrivilege):
        needed = next((v for k, v in _PRIVILEGES.items() if k in doing), "the privilege")
        return FailedPrecondition(f"{doing}: permission denied; it needs {needed} ({said})")
    if isinstance(error, psycopg2.errors.UndefinedTable | psycopg2.errors.UndefinedObject):
        return NotFound(f"{doing}: {said}")
    if isinstance(error, psycopg2.errors.ObjectNotInPrerequisiteState):
        return FailedPrecondition(f"{doing}: {said}")
    if isinstance(error, psycopg2.OperationalError):
        return Unavailable(f"{doing}: {said}")
    return CdcflowError(f"{doing}: {said}")
