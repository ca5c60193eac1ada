"""Checks a cluster session makes before a stream's first batch (issue 15): bad
configuration gets a clear error on the driver, never a stack trace from an executor."""

from __future__ import annotations

import secrets
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cdcflow.errors import FailedPrecondition

_PROBE = ".cdcflow-probe-"


def _probe_on_executor(root: str, marker: str, token: str, tasks: Iterator[int]
                       ) -> Iterator[tuple[str, str]]:
    """Executor side: read the driver's marker, write a file of its own; (host, problem)."""
    host = socket.gethostname()
    for task in tasks:
        try:
            found = Path(root, marker).read_text()
        except OSError as error:
            yield host, f"can't read the driver's probe file: {error.strerror or error}"
            continue
        if found != token:
            yield host, "sees another folder at this path than the driver does"
            continue
        try:
            Path(root, f"{marker}-{task}").write_text(token)
        except OSError as error:
            yield host, f"can't write: {error.strerror or error}"
            continue
        yield host, ""


def check_storage_root(spark: Any, root: str) -> None:
    """Raise FailedPrecondition unless every task of a small job (one per executor core)
    reads a file the driver wrote under `root` and writes one the driver then reads: the
    root is the same shared folder everywhere, and writable."""
    marker, token = f"{_PROBE}{secrets.token_hex(8)}", secrets.token_hex(16)
    try:
        Path(root).mkdir(parents=True, exist_ok=True)
        Path(root, marker).write_text(token)
    except OSError as error:
        raise FailedPrecondition(f"storage root {root!r} can't be written on the driver: "
                                 f"{error.strerror or error}") from error
    tasks = max(2, int(spark.sparkContext.defaultParallelism))
    try:
        results = spark.sparkContext.parallelize(range(tasks), tasks).mapPartitionsWithIndex(
            lambda index, _: _probe_on_executor(root, marker, token, iter([index]))).collect()
        missing = [index for index in range(tasks)
                   if not Path(root, f"{marker}-{index}").exists()]
    finally:
        for path in Path(root).glob(f"{marker}*"):
            path.unlink(missing_ok=True)
    problems = sorted({f"{host}: {problem}" for host, problem in results if problem})
    if missing and not problems:
        problems = [f"files the executors wrote are not in the driver's folder: {missing}"]
    if problems:
        raise FailedPrecondition(
            f"storage root {root!r} is not one folder shared by the driver and every "
            f"executor ({'; '.join(problems)}): mount it at the same path on every machine")

