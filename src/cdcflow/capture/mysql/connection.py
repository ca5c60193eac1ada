"""Connections to MySQL/MariaDB: the password from the environment only, sessions in UTC and
utf8mb4, and server errors turned into typed errors that say what was being done and never
carry the password."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pymysql
import pymysql.err

from cdcflow.errors import CdcflowError, FailedPrecondition, NotFound, Unavailable

ACCESS_DENIED = {1044, 1045, 1142, 1227, 1370}
UNKNOWN = {1049, 1146}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the server is and who connects; the password is read from `password_env`."""

    host: str
    port: int
    user: str
    password_env: str | None = None

    def describe(self) -> str:
        return f"{self.host}:{self.port} as {self.user}"

    def password(self) -> str:
        if self.password_env is None:
            return ""
        if self.password_env not in os.environ:
            raise FailedPrecondition(f"environment variable {self.password_env!r} "
                                     "(password_env) is not set")
        return os.environ[self.password_env]

    def settings(self) -> dict[str, Any]:
        """Keyword arguments for pymysql and for mysql-replication's connection_settings."""
        return {"host": self.host, "port": self.port, "user": self.user,
                "passwd": self.password(), "charset": "utf8mb4"}


def connect(endpoint: Endpoint, database: str | None = None) -> Any:
    """An autocommit connection whose session reads and writes times in UTC."""
    try:
        conn = pymysql.connect(host=endpoint.host, port=endpoint.port, user=endpoint.user,
                               password=endpoint.password(), database=database,
                               charset="utf8mb4", autocommit=True, connect_timeout=10,
                               init_command="SET time_zone = '+00:00'")
    except pymysql.err.Error as error:
        raise typed(error, f"cannot connect to MySQL at {endpoint.describe()}") from None
    return conn


def typed(error: BaseException, doing: str) -> CdcflowError:
    """A PyMySQL error as a cdcflow error: what was being done and what the server said."""
    code = error.args[0] if error.args and isinstance(error.args[0], int) else None
    said = " ".join(str(error.args[1] if len(error.args) > 1 else error).split())
    if code in ACCESS_DENIED:
        return FailedPrecondition(f"{doing}: access denied ({said})")
    if code in UNKNOWN:
        return NotFound(f"{doing}: {said}")
    if isinstance(error, pymysql.err.OperationalError | pymysql.err.InterfaceError):
        return Unavailable(f"{doing}: {said}")
    return CdcflowError(f"{doing}: {said}")


def query(conn: Any, statement: str, args: tuple[Any, ...] = (), doing: str = "") -> list[Any]:
    """Rows of one statement (parameters bound by the driver), errors typed."""
    try:
        with conn.cursor() as cursor:
            cursor.execute(statement, args or None)
            return list(cursor.fetchall())
    except pymysql.err.Error as error:
        raise typed(error, doing or "querying the server") from None
