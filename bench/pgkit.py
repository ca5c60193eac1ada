"""What the PostgreSQL benchmarks share: a throwaway server, pgbench, a capture-only source,
and counts read from a change log. Not a benchmark itself (no `bench_` prefix)."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cdcflow.capture.postgres.source import PostgresConfig, PostgresSource
from cdcflow.localdb import LocalPostgres, bin_dir
from cdcflow.store.changelog import ChangeLog
from cdcflow.store.log import LOG_DATA

PASSWORD_ENV = "CDCFLOW_BENCH_PG_PASSWORD"
CHANGES_PER_TPCB = 4
"""pgbench's default script writes 3 UPDATEs and 1 INSERT per transaction."""


def start_server(synchronous_commit: bool = True, durable: bool = False) -> LocalPostgres:
    """A throwaway server. It starts with fsync and full_page_writes off (cdcflow.localdb);
    `durable` turns them on, so that with `synchronous_commit` every commit is flushed, as
    under PostgreSQL's defaults."""
    server = LocalPostgres.start()
    os.environ[PASSWORD_ENV] = server.password
    settings = {"synchronous_commit": "on" if synchronous_commit else "off"}
    if durable:
        settings |= {"fsync": "on", "full_page_writes": "on"}
    for name, value in settings.items():  # fixed names and values, no user text
        server.sql("postgres", f"ALTER SYSTEM SET {name} = {value}")
    server.sql("postgres", "SELECT pg_reload_conf()")
    return server


def pgbench(server: LocalPostgres, *args: str) -> str:
    """Run pgbench against the server's `shop` database; return its standard output."""
    result = subprocess.run(
        [str(bin_dir() / "pgbench"), "-h", "127.0.0.1", "-p", str(server.port), "-U", "cdc",
         *args, "shop"], env=os.environ | {"PGPASSWORD": server.password},
        capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"pgbench {' '.join(args)} failed: {result.stderr[-2000:]}")
    return result.stdout


def pgbench_transactions(output: str) -> tuple[int, float]:
    """(transactions processed, tps without connection time) from pgbench's report."""
    done = re.search(r"number of transactions actually processed: (\d+)", output)
    tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", output)
    if done is None or tps is None:
        raise RuntimeError(f"cannot read pgbench's report: {output[-1000:]}")
    return int(done.group(1)), float(tps.group(1))


def capture_source(server: LocalPostgres, folder: Path, **settings: Any) -> PostgresSource:
    """A source over pgbench's tables whose log is `folder/log.db`."""
    config = PostgresConfig(server.dsn(), PASSWORD_ENV, "bench_slot", "bench_pub",
                            str(folder / "log.db"), ("public.pgbench_*",), **settings)
    return PostgresSource(config)


def create_slot(source: PostgresSource) -> None:
    """Publication and slot, with no backfill: capture starts at the slot's creation."""
    objects = [o for o in source.discover() if source.config.selects(o.name)]
    source.release(source.snapshot(objects, None))


class CaptureThread:
    """`source.capture` into its log on a thread, until `stop()`."""

    def __init__(self, source: PostgresSource) -> None:
        self.source = source
        self.log = ChangeLog.open(source.config.log_path)
        self.log.ensure_change_stream("changes")
        self.halt = threading.Event()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.source.capture(self.log, self.halt)
        except BaseException as error:  # reported by wait_for
            self.failure = error

    def start(self) -> CaptureThread:
        self.thread.start()
        return self

    def wait_for(self, mark: str, seconds: float) -> float:
        """Seconds until the log holds every transaction before `mark`."""
        began = time.perf_counter()
        wait_until(lambda: self._check() and self.source.reached(self.log, mark), seconds,
                   f"capture to reach {mark}")
        return time.perf_counter() - began

    def _check(self) -> bool:
        if self.failure is not None:
            raise RuntimeError(f"capture failed: {self.failure!r}")
        return True

    def stop(self) -> None:
        self.halt.set()
        self.thread.join(60)


def wait_until(condition: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while not (found := condition()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {seconds} s for {what}")
        time.sleep(0.02)
    return found


def logged_changes(log_path: str | Path) -> int:
    """Mods in the data records of a change log (read only)."""
    with sqlite3.connect(f"file:{log_path}?mode=ro", uri=True) as conn:
        (count,) = conn.execute("SELECT coalesce(sum(mods), 0) FROM _log WHERE kind = ?",
                                (LOG_DATA,)).fetchone()
    return int(count)
