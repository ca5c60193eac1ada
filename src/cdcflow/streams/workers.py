"""Capture workers: one process per stream whose source copies changes into the change log.

`cdcflow run` keeps a worker alive for each such stream while it is STARTING, RUNNING or
DRAINING. A worker that dies (a crash, a SIGKILL, a lost connection) is started again after a
backoff that doubles with each consecutive death (1 s, 2 s, 4 s ... up to a minute) and
resets once a worker has lived a minute or has appended a transaction. Nothing is lost: a
worker resumes from the position stored in the log with the last transaction it appended
(see `cdcflow.capture.source`).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdcflow.capture.source import WorkerHooks
from cdcflow.clock import Clock
from cdcflow.errors import NotFound, PositionLost
from cdcflow.model.timestamps import format_rfc3339, parse_timestamp, to_micros
from cdcflow.store.changelog import ChangeLog
from cdcflow.streams.catalog import Catalog, StreamGone
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.sources import open_source

_CONTEXT = multiprocessing.get_context("spawn")
BACKFILL_REQUEST = "backfill_request"
"""The status entry `cdcflow streams backfill` writes: {"id", "object"}."""
BACKFILL_PROGRESS = "backfill_again"
"""The status entry where the capture worker reports how that request goes."""
BACKFILL_SWEPT = "backfill_swept"
"""The status entry where the runner notes the request whose table it swept."""
BACKFILL_QUEUE = "backfill_queue"
"""Objects waiting to be backfilled again, one request after another (a lost position)."""
CAPTURE_FAILED = "capture_failed"
"""The status entry where a capture worker leaves an error no restart can mend."""


def run_capture(definition_json: str, catalog_path: str, creation: str | None = None,
                scoped: bool = False) -> None:
    """The body of a capture worker process: capture until SIGTERM. Problems the source
    reports (a TRUNCATE, say) go to the stream's errors in the catalog; when `scoped`, only
    while the stream is `creation` (None: one made before creations had ids): a worker of a
    stream deleted meanwhile ends at its next look at the catalog."""
    definition = StreamDefinition.parse(json.loads(definition_json))
    name = definition.name
    catalog = Catalog(catalog_path)
    if scoped:
        catalog = catalog.scoped(name, creation)
    hooks = WorkerHooks(
        report=lambda object_name, message: catalog.record_error(name, object_name, message),
        requests=lambda: _backfill_request(catalog, name),
        progress=lambda state: catalog.update_status(name, **{BACKFILL_PROGRESS: state}),
        position_lost=lambda message, objects: _queue_backfills(catalog, name, message,
                                                                objects))
    source = open_source(definition, Path(catalog_path).resolve().parent, hooks)
    path, change_stream = source.log_location()
    log = ChangeLog.open(path)
    log.ensure_change_stream(change_stream)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=_stop_when_orphaned, args=(stop,), daemon=True).start()
    try:
        source.capture(log, stop)
    except StreamGone:
        return  # deleted (and perhaps created again): the runner starts the new one's worker
    except PositionLost as error:  # no restart mends it: the runner fails the stream
        catalog.update_status(name, **{CAPTURE_FAILED: f"{type(error).__name__}: {error}"})
    finally:
        source.close()


def _stop_when_orphaned(stop: threading.Event) -> None:
    """Stop capturing once the runner that started this worker is gone (killed, say): the
    runner that takes the stream over starts its own worker."""
    parent = os.getppid()
    while not stop.wait(1.0):
        if os.getppid() != parent:
            stop.set()


def _queue_backfills(catalog: Catalog, name: str, message: str, objects: list[str]) -> None:
    catalog.record_error(name, "*", f"{message}; going on from the source's position now "
                                    f"and backfilling again: {', '.join(objects) or 'nothing'}")
    catalog.update_status(name, **{BACKFILL_QUEUE: objects})


def backfill_busy(status: dict[str, Any]) -> str | None:
    """Why a new request to backfill an object again must wait, or None if it need not: the
    last request is still being served, or it is done but its table is not swept yet."""
    pending, progress = status.get(BACKFILL_REQUEST), status.get(BACKFILL_PROGRESS) or {}
    if pending is not None and (progress.get("id") != pending["id"] or not progress["done"]):
        return f"still backfilling {pending['object']!r} again (request {pending['id']})"
    if progress.get("done") and not progress.get("failed") and \
            (status.get(BACKFILL_SWEPT) or {}).get("id") != progress["id"]:
        return (f"has backfilled {progress['object']!r} again but not yet swept its table of "
                f"the rows the source lost (request {progress['id']}); backfill_swept names "
                "it once the runner has")
    return None


def _backfill_request(catalog: Catalog, name: str) -> dict[str, Any] | None:
    """The stream's pending request to backfill a table again, the next of its queue once
    the last one is done and swept; none for a stream the catalog does not hold (deleted
    while its worker stops, or a worker run outside `cdcflow run`)."""
    try:
        status = catalog.status(name)
    except StreamGone:
        raise  # this worker's stream is gone: it ends
    except NotFound:
        return None
    request: dict[str, Any] | None = status.get(BACKFILL_REQUEST)
    queue = status.get(BACKFILL_QUEUE) or []
    if queue and backfill_busy(status) is None:
        request = {"id": uuid.uuid4().hex, "object": queue[0]}
        catalog.update_status(name, **{BACKFILL_REQUEST: request, BACKFILL_QUEUE: queue[1:]})
    return request


@dataclass(slots=True)
class _Worker:
    process: Any
    started: float
    deaths: int = 0
    restart_at: float = 0.0
    exit_codes: tuple[int, ...] = ()
    scope: str | None = None


class CaptureWorkers:
    """Starts, watches and restarts capture processes. `on_death(name, message, scope)`
    hears of every worker that died, with the `scope` it was started with."""

    def __init__(self, clock: Clock, on_death: Callable[[str, str, str | None], None],
                 backoff_seconds: float = 1.0, max_backoff_seconds: float = 60.0,
                 healthy_seconds: float = 60.0) -> None:
        self.clock, self.on_death = clock, on_death
        self.backoff, self.max_backoff, self.healthy = (backoff_seconds, max_backoff_seconds,
                                                        healthy_seconds)
        self._workers: dict[str, _Worker] = {}

    def _now(self) -> float:
        return to_micros(self.clock.now()) / 1e6

    def ensure(self, name: str, target: Callable[..., None], args: tuple[Any, ...],
               scope: str | None = None) -> None:
        """Keep a worker running `target(*args)` for `name`: start it, or notice its death
        and start it again once its backoff has passed. `scope` (the stream's creation) is
        what its death is reported with; a worker of another scope is stopped first."""
        worker = self._workers.get(name)
        if worker is not None and worker.scope != scope:
            self.stop(name)
            worker = None
        now = self._now()
        if worker is None:
            self._workers[name] = _Worker(self._spawn(target, args), now, scope=scope)
            return
        if worker.process is not None and worker.process.is_alive():
            return
        if worker.process is not None:
            self._bury(name, worker, now)
        if now >= worker.restart_at:
            worker.process, worker.started = self._spawn(target, args), now

    def _bury(self, name: str, worker: _Worker, now: float) -> None:
        code = worker.process.exitcode
        worker.deaths = 1 if now - worker.started >= self.healthy else worker.deaths + 1
        delay = min(self.backoff * 2 ** (worker.deaths - 1), self.max_backoff)
        worker.restart_at = now + delay
        worker.exit_codes = (*worker.exit_codes[-9:], code)
        worker.process = None
        self.on_death(name, f"capture worker exited with code {code}; restarting in "
                            f"{delay:.1f} s (death {worker.deaths} in a row)", worker.scope)

    def appended(self, name: str, at: str | None) -> None:
        """The stream's capture last appended at `at` (RFC 3339): a worker that has appended
        since it started works, and its run of deaths is over."""
        worker = self._workers.get(name)
        if worker is not None and worker.process is not None and at is not None and \
                to_micros(parse_timestamp(at)) / 1e6 > worker.started:
            worker.deaths = 0

    @staticmethod
    def _spawn(target: Callable[..., None], args: tuple[Any, ...]) -> Any:
        process = _CONTEXT.Process(target=target, args=args, daemon=True)
        process.start()
        return process

    def stop(self, name: str, timeout: float = 10.0) -> None:
        """Stop a stream's worker: SIGTERM, then SIGKILL after `timeout`."""
        worker = self._workers.pop(name, None)
        if worker is None or worker.process is None:
            return
        worker.process.terminate()
        worker.process.join(timeout)
        if worker.process.is_alive():
            os.kill(worker.process.pid, signal.SIGKILL)
            worker.process.join(5)

    def stop_all(self) -> None:
        for name in list(self._workers):
            self.stop(name)

    def info(self, name: str) -> dict[str, Any] | None:
        worker = self._workers.get(name)
        if worker is None:
            return None
        alive = worker.process is not None and worker.process.is_alive()
        return {"pid": worker.process.pid if alive else None, "alive": alive,
                "deaths_in_a_row": worker.deaths, "exit_codes": list(worker.exit_codes)}


def capture_status(log_path: str | Path, source_id: str, clock: Clock) -> dict[str, Any]:
    """Where a source's capture stands in its log: its position; `lag_seconds`, how far behind
    the source the newest appended change was when it was appended (Debezium's
    MilliSecondsBehindSource); and `idle_seconds` since the position last moved."""
    if not Path(log_path).exists():
        return {"position": None}
    stored = ChangeLog.open(log_path, create=False).position(source_id)
    if stored is None:
        return {"position": None}
    appended = to_micros(stored.appended_at)
    lag = None if stored.source_timestamp is None else (
        appended - to_micros(stored.source_timestamp)) / 1e6
    return {"position": stored.position, "lag_seconds": lag,
            "idle_seconds": (to_micros(clock.now()) - appended) / 1e6,
            "source_timestamp": None if stored.source_timestamp is None
            else format_rfc3339(stored.source_timestamp),
            "appended_at": format_rfc3339(stored.appended_at)}
