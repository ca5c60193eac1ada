"""Checks a cluster session makes before a stream's first batch (issue 15): bad
configuration gets a clear error on the driver, never a stack trace from an executor."""

from __future__ import annotations

import secrets
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cdcflow.errors import FailedPrecondition, Unavailable
from cdcflow.spark.failure_text import described

_PROBE = ".cdcflow-probe-"


def _probe_on_executor(root: str, marker: str, token: str, tasks: Iterator[int]
                       ) -> Iterator[tuple[str, str, int]]:
    """Executor side: read the driver's marker, write a file of its own; (host, problem,
    errno of an OSError or 0)."""
    host = socket.gethostname()
    for task in tasks:
        try:
            found = Path(root, marker).read_text()
        except OSError as error:
            yield host, f"can't read the driver's probe file: {error.strerror or error}", 0
            continue
        if found != token:
            yield host, "sees another folder at this path than the driver does", 0
            continue
        try:
            Path(root, f"{marker}-{task}").write_text(token)
        except OSError as error:
            yield host, f"can't write: {error.strerror or error}", error.errno or 0
            continue
        yield host, "", 0


def check_storage_root(spark: Any, root: str) -> None:
    """Raise unless every task of a small job (one per executor core registered, at least
    2) reads a file the driver wrote under `root` and writes one the driver then reads: the
    root is the same shared folder everywhere, and writable. A root that is not shared is
    FailedPrecondition; a full or read-only one is the OSError that says so (the runner
    retries those until the space returns); a probe job that fails (a lost executor, a
    cancelled job) is Unavailable, which the runner retries like any passing failure."""
    marker, token = f"{_PROBE}{secrets.token_hex(8)}", secrets.token_hex(16)
    Path(root).mkdir(parents=True, exist_ok=True)  # an OSError here names the path
    Path(root, marker).write_text(token)
    tasks = max(2, int(spark.sparkContext.defaultParallelism))
    try:
        results = _run_probe(spark, root, marker, token, tasks)
        missing = [index for index in range(tasks)
                   if not Path(root, f"{marker}-{index}").exists()]
    finally:
        for path in Path(root).glob(f"{marker}*"):
            path.unlink(missing_ok=True)
    problems = sorted({f"{host}: {problem}" for host, problem, _ in results if problem})
    refusals = {number for _, problem, number in results if problem and number}
    if problems and len(refusals) == 1 and all(number for _, p, number in results if p):
        raise OSError(refusals.pop(), f"executors can't write storage root {root!r} "
                      f"({'; '.join(problems)})", root)
    if missing and not problems:
        problems = [f"files the executors wrote are not in the driver's folder: {missing}"]
    if problems:
        raise FailedPrecondition(
            f"storage root {root!r} is not one folder shared by the driver and every "
            f"executor ({'; '.join(problems)}): mount it at the same path on every machine")


def _run_probe(spark: Any, root: str, marker: str, token: str, tasks: int
               ) -> list[tuple[str, str, int]]:
    try:
        return list(spark.sparkContext.parallelize(range(tasks), tasks).mapPartitionsWithIndex(
            lambda index, _: _probe_on_executor(root, marker, token, iter([index]))).collect())
    except Exception as error:  # a lost executor, say: no verdict on the root
        raise Unavailable(f"the probe of storage root {root!r} could not run on the "
                          f"executors: {described(error, 1000)}") from error
