"""The Spark master a session is for, checked before a JVM starts (issue 15).

Spark itself, given a standalone master that is down, retries for about a minute and then
fails with a JVM stack trace; so it does with a master of another Spark version. `check_master`
says at once which master and why, and it refuses the masters cdcflow does not run on.
"""

from __future__ import annotations

import json
import os
import re
import socket
import urllib.request
from importlib.metadata import version

from cdcflow.errors import FailedPrecondition, InvalidArgument

_LOCAL = re.compile(r"local(\[(\*|[1-9][0-9]*)(,[1-9][0-9]*)?\])?")
_STANDALONE = "spark://"
REST_PORT_VARIABLE = "CDCFLOW_SPARK_REST_PORT"
_FORMS = "local, local[N], local[*], local[N,F] or spark://HOST:PORT[,HOST:PORT...]"


def is_local(master: str) -> bool:
    """Whether `master` is a local one: local, local[N], local[*] or local[N,F]."""
    return _LOCAL.fullmatch(master) is not None


def standalone_addresses(master: str) -> list[tuple[str, int]]:
    """The (host, port) of each master of a standalone URL; [] for a local master. Any
    other master is InvalidArgument."""
    if is_local(master):
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


def rest_port() -> int:
    """The port of the masters' REST server: CDCFLOW_SPARK_REST_PORT, else Spark's 6066."""
    text = os.environ.get(REST_PORT_VARIABLE, "6066")
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise InvalidArgument(f"{REST_PORT_VARIABLE}={text!r} is not a port in 1-65535")
    return int(text)


def server_version(host: str, timeout: float) -> str | None:
    """The Spark version the master's REST server at `host` says it runs; None when no REST
    server answers there, or its answer does not say."""
    name = f"[{host}]" if ":" in host else host
    url = f"http://{name}:{rest_port()}/v1/submissions/readyz"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            said = json.load(answer)
    except (OSError, ValueError):
        return None
    found = said.get("serverSparkVersion") if isinstance(said, dict) else None
    return str(found) if found else None


def check_version(master: str, host: str, timeout: float) -> None:
    """Raise FailedPrecondition when the master's REST server says it runs another Spark
    (major.minor) than this pyspark: the application would wait a minute for a master that
    can't read it. No REST server there: no verdict."""
    server = server_version(host, timeout)
    client = version("pyspark")
    if server and server.split(".")[:2] != client.split(".")[:2]:
        raise FailedPrecondition(
            f"Spark master {master!r} runs Spark {server}, but this client's pyspark is "
            f"{client}: the cluster and every client need the same Spark version "
            f"(pip install 'pyspark=={server}')")


def check_master(master: str, timeout: float = 5.0) -> None:
    """Raise unless `master` is a local master, or one of its standalone masters accepts a
    TCP connection within `timeout` seconds (FailedPrecondition naming each try) and does
    not run another Spark version than this pyspark (`check_version`)."""
    failures = []
    addresses = standalone_addresses(master)
    for host, port in addresses:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                pass
        except OSError as error:
            failures.append(f"{host}:{port}: {error.strerror or error}")
            continue
        check_version(master, host, timeout)
        return
    if addresses:
        raise FailedPrecondition(
            f"Spark master {master!r} can't be reached ({'; '.join(failures)}): start the "
            "master or correct its host and port")
