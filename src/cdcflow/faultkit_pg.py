"""The fault campaign's PostgreSQL side (`cdcflow.faultkit`): a throwaway server, a stream of
its `public` tables into a CDC-table warehouse and event files on the campaign's destination
mount, and the two faults only this source has:

* kill-capture: SIGKILL the stream's capture worker (the runner starts another, which resumes
  from the position stored with the last transaction it appended);
* restart-postgres: restart the server under the capture worker and the writer, in turn a
  crash (`pg_ctl -m immediate`: the slot may send again what was confirmed after the last
  checkpoint) and a fast shutdown.

Each is mended when the capture has appended a transaction committed after it, and the
stream has finished a batch since. In a campaign with both sources each runner-side fault has
a PostgreSQL fault for company (`Companion`), injected at a random moment while the other is
under way: a capture worker is killed as soon as the restarted runner has started it, the
server restarted while the runner is down or the disk full.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cdcflow.localdb import LocalPostgres
from cdcflow.model.timestamps import parse_timestamp, to_micros
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.lease import process_state
from cdcflow.workload_faults import PG_DDL, PG_PASSWORD_ENV

PG_NAME = "faults-pg"
PG_KINDS = ("kill-capture", "restart-postgres")
PASSWORD_ENV = PG_PASSWORD_ENV
"""The runner, its capture workers and the writer inherit the password from here."""

Wait = Callable[[Callable[[], Any], float, str], None]

STREAM_SPARK = {"trigger_seconds": 0.3, "max_records_per_trigger": 300}
"""The Spark options of the campaign's streams."""
APPLY_STALENESS_SECONDS = 4.0
"""The campaign's CDC tables' max_staleness: the runner applies them every 2 s (not every
10 s, as without one), so a kill mid-apply finds its moment soon."""


class PostgresSide:
    def __init__(self, dest: Path, wait: Wait, now: Callable[[], float]) -> None:
        self.dest = dest
        self.wait = wait
        self.now = now
        self.server: LocalPostgres | None = None
        self.restarts = 0

    def setup(self, catalog: Catalog) -> None:
        self.server = LocalPostgres.start()
        os.environ[PASSWORD_ENV] = self.server.password
        self.server.sql("shop", f"SET ROLE cdc; {PG_DDL}")  # cdc owns them: it publishes them
        self.catalog = catalog
        catalog.create(StreamDefinition.parse({
            "name": PG_NAME, "backfill": "all", "include": ["public.*"],
            "source": {"kind": "postgres", "dsn": self.server.dsn(), "heartbeat_seconds": 1,
                       "password_env": PASSWORD_ENV},
            "destinations": [
                {"kind": "cdc_table", "warehouse": str(self.dest / "pg-warehouse"),
                 "max_staleness_seconds": APPLY_STALENESS_SECONDS},
                {"kind": "event_files", "root": str(self.dest / "pg-events"),
                 "max_events": 500}],
            "spark": STREAM_SPARK}))
        catalog.act(PG_NAME, "start")

    def dsn(self) -> str:
        assert self.server is not None
        return self.server.dsn()

    def teardown(self) -> None:
        if self.server is not None:
            self.server.stop()

    def _capture(self) -> dict[str, Any]:
        return dict(self.catalog.status(PG_NAME).get("capture") or {})

    def _batches(self) -> int:
        return int(self.catalog.status(PG_NAME).get("batches") or 0)

    def kill_capture(self, runner_pid: Callable[[], int | None]) -> float:
        """SIGKILL the capture worker of the runner now running, as soon as there is one; the
        seconds until the stream caught up again."""
        pid: int | None = None

        def seen() -> bool:
            nonlocal pid
            pid = self._worker_of(runner_pid())
            return pid is not None

        self.wait(seen, 300, "a capture worker to kill")
        assert pid is not None  # the pid seen alive: never 0, which would be the group
        began = self.now()
        os.kill(pid, signal.SIGKILL)
        return self._recovered(began)

    def _worker_of(self, runner: int | None) -> int | None:
        """The capture worker's pid, if it is alive and a child of `runner` (a pid in the
        status may be a dead worker's, or by now another process's)."""
        pid = self._capture().get("pid")
        if pid is None or runner is None:
            return None
        found = process_state(int(pid))
        return int(pid) if found is not None and found[0] != "Z" and found[1] == runner \
            else None

    def restart_server(self) -> float:
        """Restart PostgreSQL (a crash, then a fast shutdown, in turn)."""
        assert self.server is not None
        self.restarts += 1
        began = self.now()
        self.server.restart("immediate" if self.restarts % 2 else "fast")
        return self._recovered(began)

    def _recovered(self, began: float) -> float:
        before = self._batches()
        self.wait(lambda: self._appended_since(began) and self._batches() > before, 300,
                  "the PostgreSQL capture to append and the stream to run a batch again")
        return self.now() - began

    def _appended_since(self, moment: float) -> bool:
        appended = self._capture().get("appended_at")
        return appended is not None and to_micros(parse_timestamp(appended)) / 1e6 > moment


class Companion(threading.Thread):
    """A PostgreSQL fault (`kind`), injected `delay` seconds from now, on its own thread; its
    recovery time, or the error that stopped it, once joined."""

    def __init__(self, side: PostgresSide, kind: str, rng: random.Random,
                 runner_pid: Callable[[], int | None]) -> None:
        super().__init__(name=f"fault-{kind}", daemon=True)
        self.side, self.kind, self.runner_pid = side, kind, runner_pid
        self.delay = rng.uniform(0, 2)  # the other fault is mended in 2-5 s
        self.recovery: float | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        time.sleep(self.delay)  # the random moment the fault lands, not a wait for anything
        try:
            self.recovery = self.side.kill_capture(self.runner_pid) \
                if self.kind == "kill-capture" else self.side.restart_server()
        except BaseException as error:  # raised again by the campaign's thread
            self.error = error

    def outcome(self) -> float:
        self.join()
        if self.error is not None:
            raise self.error
        assert self.recovery is not None
        return self.recovery
