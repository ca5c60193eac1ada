"""The runner's apply jobs (AP-5): every table of a running stream is applied at least every
`max_staleness / 2` (every 10 s without one), in one background thread, so pending changes
stay bounded, reads inside the staleness are cheap, the apply watermark moves and tombstones
expire. Each stream's status shows, per table, its apply watermark and pending rows.

Every `VACUUM_EVERY_SECONDS` (and at a table's first apply in the runner) a table is vacuumed
after its apply: the files no version within its file_retention names are deleted
(`cdcflow.table.vacuum`), so its folder does not grow with every apply."""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdcflow.clock import Clock
from cdcflow.model.timestamps import format_rfc3339, to_micros
from cdcflow.table import CdcTable

VACUUM_EVERY_SECONDS = 600.0


@dataclass(slots=True)
class _Due:
    stream: str
    tables: dict[str, str]
    every_seconds: float
    last: dict[str, int]
    vacuumed: dict[str, int]
    creation: str | None
    """The creation of the stream that watched: its reports name it."""


class Applier:
    """Call `watch` for each running stream and `forget` when it stops; `start` the thread."""

    def __init__(self, clock: Clock,
                 report: Callable[[str, dict[str, Any], str | None], None],
                 on_error: Callable[..., None]) -> None:
        """`report(stream, status, creation)` after applies; `on_error(stream, table, error,
        creation)` for a failed apply, and a failed vacuum adds `job="vacuum"`. `creation`
        is the one the stream had when `watch` was called: a stream deleted (and perhaps
        created again) while an apply was in flight is told apart."""
        self.clock, self.report, self.on_error = clock, report, on_error
        self._streams: dict[str, _Due] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, stream: str, tables: dict[str, str], every_seconds: float,
              creation: str | None = None) -> None:
        with self._lock:
            if stream not in self._streams:
                self._streams[stream] = _Due(stream, dict(tables), every_seconds, {}, {},
                                             creation)

    def forget(self, stream: str) -> None:
        with self._lock:
            self._streams.pop(stream, None)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="cdcflow-apply", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            with self._lock:
                due = list(self._streams.values())
            for item in due:
                try:
                    self.apply_due(item.stream)
                except Exception as error:  # e.g. a table's status unreadable: keep going
                    traceback.print_exc()
                    self.on_error(item.stream, "*", error, item.creation)

    def apply_due(self, stream: str, force: bool = False) -> None:
        """Apply the stream's tables whose interval has passed (all of them with `force`)."""
        with self._lock:
            item = self._streams.get(stream)
        if item is None:
            return
        now = to_micros(self.clock.now())
        applied = False
        for name, root in item.tables.items():
            if force or now - item.last.get(name, 0) >= item.every_seconds * 1e6:
                try:
                    self._apply(item, name, root, now)
                except Exception as error:  # a failing table must not stop the others
                    traceback.print_exc()
                    self.on_error(stream, name, error, item.creation)
                item.last[name] = now
                applied = True
        if applied:
            self.report(stream, table_status(item.tables, self.clock), item.creation)

    def _apply(self, item: _Due, name: str, root: str, now: int) -> None:
        """Apply one table, then vacuum it when its last vacuum is VACUUM_EVERY_SECONDS
        old."""
        table = CdcTable.open(root, clock=self.clock)
        table.apply()
        if now - item.vacuumed.get(name, 0) >= VACUUM_EVERY_SECONDS * 1e6:
            item.vacuumed[name] = now
            try:
                table.vacuum()
            except Exception as error:  # the table is applied: only its space waits
                traceback.print_exc()
                self.on_error(item.stream, name, error, item.creation, job="vacuum")


def table_status(tables: dict[str, str], clock: Clock) -> dict[str, Any]:
    """Per table: root, apply watermark (RFC 3339 or None) and pending (unapplied) rows."""
    out = {}
    for name, root in tables.items():
        table = CdcTable.open(root, clock=clock)
        watermark = table.upsert_stream_apply_watermark
        out[name] = {"root": root, "pending_rows": table.pending_row_count(),
                     "apply_watermark": None if watermark is None else format_rfc3339(watermark)}
    return {"tables": out}
