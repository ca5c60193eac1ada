"""Stopping a Spark streaming query between batches, never inside one. (No pyspark import:
the query arrives as an argument.)

`query.stop()` interrupts the stream execution thread wherever it is. Inside the Python
`foreachBatch` callback, a JVM call the callback makes (its `collect()`) fails with a Py4J
error whose text embeds a whole Java stack trace; Spark 4 checks that text with a recursive
regular expression (`StreamExecution.PROXY_ERROR`), which overflows the thread's stack past
about 2 kB of text: the stream thread dies of a `StackOverflowError`, the query reports no
exception, and the interrupted batch is only repeated on the next start.

So a query is held first. The runner writes a control file `{"token", "until"}`; at every
trigger the "cdcflow" source plans no batch past `until` (micros; null: past where it stands),
and when it plans none it writes `<control>.ack` with the token. Spark asks for the latest
offset only after the previous batch has committed, and plans no batch for an unchanged
offset, so once the ack is there no batch is running and none can start: stop() then only
interrupts a trigger wait or the source's own socket I/O, which Spark handles cleanly.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

from cdcflow.errors import FailedPrecondition


def _write_json(path: str, data: dict[str, Any]) -> None:
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as handle:
        json.dump(data, handle)
    os.replace(temporary, path)


def read_control(path: str | None) -> dict[str, Any] | None:
    """The hold a control file asks for, or None when there is none."""
    if not path:
        return None
    try:
        with open(path) as handle:
            found: dict[str, Any] = json.load(handle)
            return found
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def acknowledge(path: str, token: str) -> None:
    """Called by the source when it planned no batch under the hold `token`."""
    _write_json(f"{path}.ack", {"token": token})


class QueryControl:
    """The control file of one query."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)

    def release(self) -> None:
        """No hold: the query runs freely (call before starting it)."""
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        for name in (self.path, f"{self.path}.ack"):
            Path(name).unlink(missing_ok=True)

    def hold(self, until: int | None) -> str:
        """Ask the source to plan no batch past `until` (None: past where it stands)."""
        token = uuid.uuid4().hex
        _write_json(self.path, {"token": token, "until": until})
        return token

    def acknowledged(self, token: str) -> bool:
        return (read_control(f"{self.path}.ack") or {}).get("token") == token


def stop_between_batches(query: Any, control: QueryControl | None, until: int | None = None,
                         timeout: float | None = 300.0) -> None:
    """Hold the query at `until` (None: where it stands), wait until the source says no batch
    runs or can start, then stop it. With `until` set this first lets the query catch up to
    it (a drain). If the query dies meanwhile, its failure is raised."""
    if control is not None and query.isActive:
        token = control.hold(until)
        deadline = None if timeout is None else time.monotonic() + timeout
        while query.isActive and not control.acknowledged(token):
            if deadline is not None and time.monotonic() > deadline:
                raise FailedPrecondition(
                    f"the streaming query did not come to rest within {timeout:.0f} s of "
                    "being held; it was left running")
            time.sleep(0.02)
    failure = query.exception()
    if failure is not None:
        raise RuntimeError(f"the streaming query failed: {failure}")
    if query.isActive:
        query.stop()


def batch_timing(query: Any, result: dict[str, Any]) -> dict[str, Any]:
    """Where a batch's time went: cdcflow's fold and writes (this batch), and Spark's own
    phases of the previous trigger (its progress report: planning, offset and commit logs)."""
    timing: dict[str, Any] = {"write_ms": round(result["seconds"] * 1000, 1)}
    try:
        progress = query.lastProgress if query is not None else None
    except Exception:  # the query is stopping: its last report is gone with it
        progress = None
    if progress:
        timing["spark_ms"] = dict(progress.get("durationMs") or {})
    return timing


def committed_micros(query: Any) -> int | None:
    """How far the query's last finished batch read the log: every record at or before this
    commit time (micros) is written to its destinations. None before its first batch."""
    progress = query.lastProgress if query is not None else None
    if progress is None:
        return None
    sources = progress["sources"] if isinstance(progress, dict) else progress.sources
    if not sources:
        return None
    first = sources[0]
    end = first["endOffset"] if isinstance(first, dict) else first.endOffset
    if isinstance(end, str):
        end = json.loads(end) if end and end != "null" else None
    if not isinstance(end, dict) or "timestamp" not in end:
        return None
    return int(end["timestamp"])


_UNFINISHED = re.compile(r"\.\.?[0-9]+\.[0-9a-f-]+\.tmp(\.crc)?")


def remove_unfinished_writes(checkpoint: str | Path) -> list[str]:
    """Delete the temporary files a killed query left in its checkpoint's offset and commit
    logs; the names deleted. Spark writes each entry aside (`.<id>.<uuid>.tmp`) and renames
    it, so such a file is an entry never logged. Spark 4 refuses to start a query whose
    offset log holds any file before its first batch (STATE_STORE_CHECKPOINT_LOCATION_NOT_
    EMPTY), so a SIGKILL while batch 0's offsets were written failed the stream for good.
    Call it only while no query runs on the checkpoint."""
    removed = []
    for log in ("offsets", "commits"):
        folder = Path(checkpoint) / log
        for path in folder.iterdir() if folder.is_dir() else ():
            if _UNFINISHED.fullmatch(path.name):
                path.unlink(missing_ok=True)
                removed.append(f"{log}/{path.name}")
    return sorted(removed)
