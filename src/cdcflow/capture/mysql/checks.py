"""What a binlog reader needs from the server, checked before capture starts: every missing
setting and privilege is named in one FailedPrecondition, with the statement that fixes it."""

from __future__ import annotations

import re
from typing import Any

from cdcflow.capture.mysql.connection import query
from cdcflow.errors import FailedPrecondition

REQUIRED = (
    ("log_bin", "ON", "start the server with --log-bin"),
    ("binlog_format", "ROW", "SET GLOBAL binlog_format = 'ROW'"),
    ("binlog_row_image", "FULL", "SET GLOBAL binlog_row_image = 'FULL'"),
    ("binlog_row_metadata", "FULL", "SET GLOBAL binlog_row_metadata = 'FULL'"),
)
"""(variable, value, fix). binlog_row_metadata only where the server has it (MySQL 8.0.1+,
MariaDB 10.5+): without it the binlog carries no column names."""


def server_variables(conn: Any) -> dict[str, str]:
    names = [name for name, _, _ in REQUIRED] + ["version", "server_id"]
    rows = query(conn, "SHOW GLOBAL VARIABLES WHERE Variable_name IN (" +
                 ", ".join(["%s"] * len(names)) + ")", tuple(names),
                 "reading the server's binlog settings")
    return {str(name).lower(): str(value) for name, value in rows}


def missing_settings(variables: dict[str, str]) -> list[str]:
    problems = []
    for name, wanted, fix in REQUIRED:
        value = variables.get(name)
        if value is None:
            if name == "binlog_row_metadata":
                continue  # older servers: column names come from the table-map and schema
            problems.append(f"{name} is not set; needs {wanted} ({fix})")
        elif value.upper() != wanted:
            problems.append(f"{name}={value}; needs {wanted} ({fix})")
    if variables.get("server_id", "1") == "0":
        problems.append("server_id=0; a binlog source needs a non-zero server_id")
    return problems


_GRANT = re.compile(r"^GRANT (.+?) ON (\S+) TO ", re.IGNORECASE)


def missing_privileges(grants: list[str]) -> list[str]:
    """REPLICATION SLAVE and REPLICATION CLIENT (MariaDB 10.5+: BINLOG MONITOR), on *.*."""
    held: set[str] = set()
    for grant in grants:
        found = _GRANT.match(grant)
        if found and found[2].replace("`", "") == "*.*":
            held |= {p.strip().upper() for p in found[1].split(",")}
    if "ALL PRIVILEGES" in held:
        return []
    problems = []
    if "REPLICATION SLAVE" not in held and "REPLICATION REPLICA" not in held:
        problems.append("the REPLICATION SLAVE privilege "
                        "(GRANT REPLICATION SLAVE ON *.* TO the user)")
    if not held & {"REPLICATION CLIENT", "BINLOG MONITOR", "SUPER"}:
        problems.append("the REPLICATION CLIENT privilege (BINLOG MONITOR on MariaDB 10.5+; "
                        "GRANT REPLICATION CLIENT ON *.* TO the user)")
    return problems


def check_server(conn: Any, describe: str) -> dict[str, str]:
    """Raise FailedPrecondition naming every missing setting and privilege; return the
    server's variables when nothing is missing."""
    variables = server_variables(conn)
    grants = [str(row[0]) for row in query(conn, "SHOW GRANTS", (), "reading the grants")]
    problems = missing_settings(variables) + missing_privileges(grants)
    if problems:
        raise FailedPrecondition(f"the MySQL server at {describe} cannot be read by a binlog "
                                 "source: " + "; ".join(problems))
    return variables
