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
    parts = psycopg2.extensions.parse_dsn(dsn)
    return (f"{parts.get('host', 'localhost')}:{parts.get('port', 5432)}/"
            f"{parts.get('dbname', '?')} as {parts.get('user', '?')}")


def servers_of(dsn: str) -> frozenset[str]:
    """The servers a DSN may reach, each `host:port` as the DSN writes it: its lists of hosts
    (or `hostaddr`) and ports paired as libpq pairs them, `localhost` and 5432 where it
    names none, `service NAME` for a service file's entry."""
    parts = psycopg2.extensions.parse_dsn(dsn)
    if "service" in parts and not {"host", "hostaddr"} & set(parts):
        return frozenset({f"service {parts['service']}"})
    hosts = str(parts.get("hostaddr") or parts.get("host") or "").split(",")
    ports = str(parts.get("port") or "").split(",")
    ports = ports * len(hosts) if len(ports) == 1 else ports
    pairs = zip(hosts, ports, strict=False)  # lists of two lengths: libpq refuses the DSN
    return frozenset(f"[{host}]:{port or 5432}" if ":" in host else
                     f"{host or 'localhost'}:{port or 5432}" for host, port in pairs)


def databases_of(dsn: str) -> frozenset[str]:
    """`host:port/dbname` for each of `servers_of`; the database named after the user where
    the DSN names none, as libpq does."""
    parts = psycopg2.extensions.parse_dsn(dsn)
    name = parts.get("dbname") or parts.get("user") or "?"
    return frozenset(f"{server}/{name}" for server in servers_of(dsn))


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


MIN_SERVER_VERSION = 140000
"""PostgreSQL 14: pgoutput's `messages` option (the capture's marks) is new in 14, and
`pg_current_snapshot()` (the snapshot's bounds) in 13."""


def check_server_version(conn: Any, dsn: str, minimum: int | None = None) -> None:
    """FailedPrecondition naming the server and its version if it is older than `minimum`
    (a `server_version_num`; default MIN_SERVER_VERSION), before anything is made on it."""
    minimum = MIN_SERVER_VERSION if minimum is None else minimum
    found = int(conn.server_version)
    if found < minimum:
        raise FailedPrecondition(
            f"PostgreSQL at {describe_dsn(dsn)} is version {version_text(found)}; the source "
            f"needs {version_text(minimum)} or newer (pgoutput's 'messages' option, "
            "pg_current_snapshot())")


def version_text(number: int) -> str:
    """`server_version_num` as PostgreSQL writes its version: 150004 is 15.4, and before
    10 it had three parts: 90624 is 9.6.24."""
    if number < 100000:
        return f"{number // 10000}.{number // 100 % 100}.{number % 100}"
    return f"{number // 10000}.{number % 10000}"


_PRIVILEGES = {
    "replication slot": "the REPLICATION attribute (ALTER ROLE ... REPLICATION)",
    "publication": "CREATE on the database, and ownership of the published tables",
}


def typed(error: BaseException, doing: str) -> CdcflowError:
    """A psycopg2 error as a cdcflow error: what was being done and what the server said.
    A cdcflow error (a password variable not set, a server too old) stays as it is."""
    if isinstance(error, CdcflowError):
        return error
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
