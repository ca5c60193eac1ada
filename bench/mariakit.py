"""What the MySQL/MariaDB benchmarks share: a throwaway MariaDB, sysbench, a capture-only
source, and a capture worker on a thread. Not a benchmark itself (no `bench_` prefix).

The password is the server's, put in the environment variable PASSWORD_ENV; clients that run
as programs (sysbench, mariadb-dump) get it through MYSQL_PWD, never on a command line."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from cdcflow.capture.mysql.connection import Endpoint
from cdcflow.capture.mysql.source import MySqlConfig, MySqlSource
from cdcflow.localmaria import LocalMariaDB
from cdcflow.store.changelog import ChangeLog
from pgkit import wait_until

PASSWORD_ENV = "CDCFLOW_BENCH_MYSQL_PASSWORD"
DATABASE = "shop"
SERVER_ID = 5401
CHANGES_PER_WRITE_ONLY = 4
"""sysbench's oltp_write_only writes, per transaction, an UPDATE of k, an UPDATE of c, a DELETE
and an INSERT of the deleted id (index_updates = non_index_updates = delete_inserts = 1)."""
ROW_COUNTERS = ("Handler_write", "Handler_update", "Handler_delete")
"""The server's row writes to tables (MariaDB counts its temporary tables apart)."""


def start_server(settings: dict[str, str | None] | None = None) -> LocalMariaDB:
    server = LocalMariaDB.start(settings=settings)
    os.environ[PASSWORD_ENV] = server.password
    return server


def client_env() -> dict[str, str]:
    """The environment of a MariaDB client program: the password in MYSQL_PWD."""
    return os.environ | {"MYSQL_PWD": os.environ[PASSWORD_ENV]}


def sysbench(server: LocalMariaDB, *args: str, test: str = "oltp_write_only") -> str:
    """Run sysbench against the server's `shop` database as `cdc`; return its output."""
    result = subprocess.run(
        ["sysbench", test, "--db-driver=mysql", "--mysql-host=127.0.0.1",
         f"--mysql-port={server.port}", "--mysql-user=cdc", f"--mysql-db={DATABASE}", *args],
        env=client_env(), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"sysbench {' '.join(args)} failed: "
                           f"{(result.stdout + result.stderr)[-2000:]}")
    return result.stdout


def sysbench_transactions(output: str) -> tuple[int, float]:
    """(transactions, transactions per second) from sysbench's report."""
    found = re.search(r"transactions:\s+(\d+)\s+\(([\d.]+) per sec\.\)", output)
    if found is None:
        raise RuntimeError(f"cannot read sysbench's report: {output[-1000:]}")
    return int(found.group(1)), float(found.group(2))


def sysbench_ignored(output: str) -> int:
    """Errors sysbench ignored and retried (deadlocks): their transactions rolled back."""
    found = re.search(r"ignored errors:\s+(\d+)", output)
    return int(found.group(1)) if found else 0


def row_writes(server: LocalMariaDB) -> int:
    """The server's row writes to tables since it started (see ROW_COUNTERS)."""
    names = ", ".join(f"'{name}'" for name in ROW_COUNTERS)
    rows = server.sql(f"SHOW GLOBAL STATUS WHERE Variable_name IN ({names})")
    return sum(int(value) for _, value in rows)


def endpoint(server: LocalMariaDB) -> Endpoint:
    return Endpoint("127.0.0.1", server.port, "cdc", PASSWORD_ENV)


def capture_source(server: LocalMariaDB, folder: Path, include: tuple[str, ...],
                   **settings: Any) -> MySqlSource:
    """A source over `include` (database.table patterns) whose log is `folder/log.db`."""
    config = MySqlConfig(endpoint(server), (DATABASE,), SERVER_ID, str(folder / "log.db"),
                         include, **settings)
    return MySqlSource(config)


def start_position(source: MySqlSource) -> None:
    """A snapshot with no backfill: the capture starts at the binlog position it saw."""
    objects = [o for o in source.discover() if source.config.selects(o.name)]
    source.release(source.snapshot(objects, None))


class CaptureThread:
    """`capture` into the log on a thread, until `stop()`. The capture has a source of its
    own: `watch` (the caller's) reads the binlog's end on another connection."""

    def __init__(self, watch: MySqlSource) -> None:
        self.watch = watch
        self.source = MySqlSource(watch.config)
        self.log = ChangeLog.open(watch.config.log_path)
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

    def wait_for(self, mark: dict[str, Any], seconds: float) -> float:
        """Seconds until the log holds every transaction before `mark`."""
        began = time.perf_counter()
        wait_until(lambda: self._check() and self.watch.reached(self.log, mark), seconds,
                   f"capture to reach {mark}")
        return time.perf_counter() - began

    def _check(self) -> bool:
        if self.failure is not None:
            raise RuntimeError(f"capture failed: {self.failure!r}")
        return True

    def stop(self) -> None:
        self.halt.set()
        self.thread.join(60)
        self.source.close()
