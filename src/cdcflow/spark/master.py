"""The Spark master a session is for, checked before a JVM starts (issue 15).

Spark itself, given a standalone master that is down, retries for about a minute and then
fails with a JVM stack trace. `check_master` says at once which master and why, and it
refuses the masters cdcflow does not run on.
"""

from __future__ import annotations

import re
import socket

from cdcflow.errors import FailedPrecondition, InvalidArgument

_LOCAL = re.compile(r"local(\[(\*|[1-9][0-9]*)(,[1-9][0-9]*)?\])?")
_STANDALONE = "spark://"
_FORMS = "local, local[N], local[*], local[N,F] or spark://HOST:PORT[,HOST:PORT...]"


def standalone_addresses(master: str) -> list[tuple[str, int]]:
    """The (host, port) of each master of a standalone URL; [] for a local master. Any
    other master is InvalidArgument."""
    if _LOCAL.fullmatch(master):
        return []
    if not master.startswith(_STANDALONE):
        raise InvalidArgument(f"Spark master {master!r} is not supported: use {_FORMS}")
    return [_address(master, part) for part in master[len(_STANDALONE):].split(",")]


def _address(master: str, part: str) -> tuple[str, int]:
    host, _, port = part.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # [::1]:7077
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(
            f"Spark master {master!r}: {part!r} is not HOST:PORT with a port in 1-65535")
    return host, int(port)


def check_master(master: str, timeout: float = 5.0) -> None:
    """Raise unless `master` is a local master or one of its standalone masters accepts a
    TCP connection within `timeout` seconds (FailedPrecondition naming each try)."""
    failures = []
    addresses = standalone_addresses(master)
    for host, port in addresses:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return
        except OSError as error:
            failures.append(f"{host}:{port}: {error.strerror or error}")
    if addresses:
        raise FailedPrecondition(
            f"Spark master {master!r} can't be reached ({'; '.join(failures)}): start the "
            "master or correct its host and port")
