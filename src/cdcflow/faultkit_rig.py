"""The fault campaign's rig (`cdcflow.faultkit`): the embedded database and the catalog with
its stream (and, with `postgres`, the PostgreSQL side), the destination on its own tmpfs, and
the `cdcflow run` processes, with what the campaign asks of them: which one drives the
streams, whether they run batches again, whether a stream failed with a given error, whether
the standbys are warm."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdcflow.cli.run import WARM_UP_SAID
from cdcflow.clock import SYSTEM_CLOCK
from cdcflow.faultkit_pg import APPLY_STALENESS_SECONDS, PG_NAME, STREAM_SPARK, PostgresSide
from cdcflow.model.partitions import PartitionPolicy
from cdcflow.model.timestamps import to_micros
from cdcflow.store.database import Database
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.lease import holder_pid
from cdcflow.streams.states import StreamState
from cdcflow.testing import WORKLOAD_DDL

if TYPE_CHECKING:
    from cdcflow.faultkit import Campaign

NAME = "faults"


class Rig:
    """The system under faults: database, catalog, destination mount, runner, writer."""

    def __init__(self, campaign: Campaign) -> None:
        self.campaign = campaign
        self.folder = campaign.folder
        self.dest = self.folder / "dest"
        self.runners: list[subprocess.Popen[bytes]] = []
        self.logs: dict[int, Path] = {}
        """Each runner's output file, by its pid."""
        self.warm: set[int] = set()
        """The runners that have said their warm-up is over."""
        self.starts = 0
        self.rng = random.Random(campaign.seed)
        self.names = [NAME, PG_NAME] if campaign.postgres else [NAME]
        self.pg = PostgresSide(self.dest, wait_for, now_seconds) if campaign.postgres else None

    def setup(self) -> None:
        self.dest.mkdir(parents=True, exist_ok=True)
        run_command("mount", "-t", "tmpfs", "-o", f"size={self.campaign.tmpfs_mb}m", "tmpfs",
             str(self.dest))
        self.db_path = str(self.folder / "shop.db")
        db = Database.open(self.db_path, partition_policy=PartitionPolicy(split_records=300))
        db.ddl(WORKLOAD_DDL)
        db.ddl("CREATE CHANGE STREAM Everything FOR ALL")
        db.close()
        self.catalog = Catalog(self.folder / "catalog.db")
        self.catalog.create(StreamDefinition.parse({
            "name": NAME, "source": {"database": self.db_path, "change_stream": "Everything"},
            "backfill": "all",
            "destinations": [
                {"kind": "cdc_table", "warehouse": str(self.dest / "warehouse"),
                 "max_staleness_seconds": APPLY_STALENESS_SECONDS},
                {"kind": "event_files", "root": str(self.dest / "events"), "max_events": 500}],
            "spark": STREAM_SPARK}))
        self.catalog.act(NAME, "start")
        if self.pg is not None:
            self.pg.setup(self.catalog)

    def writer_targets(self) -> list[str]:
        """What each writer writes to: the database file, and the PostgreSQL DSN."""
        return [self.db_path] + ([self.pg.dsn()] if self.pg is not None else [])

    def teardown(self) -> None:
        for runner in list(self.runners):
            self.kill(runner)
        with contextlib.suppress(RuntimeError):
            run_command("umount", "-l", str(self.dest))
        if self.pg is not None:
            self.pg.teardown()

    # ---- processes -------------------------------------------------------------------------

    def start_runner(self) -> None:
        """Start one more `cdcflow run`: the one that drives the streams, or (while another
        holds the lease) a standby that takes over once that one dies."""
        self.starts += 1
        path = self.folder / f"runner-{self.starts}.log"
        with path.open("wb") as log:
            self.runners.append(subprocess.Popen(
                [sys.executable, "-m", "cdcflow.cli.main", "run", "--catalog",
                 str(self.folder / "catalog.db"), "--master", "local[2]", "--json",
                 "--lease-seconds", "3"], start_new_session=True, stdout=log,
                stderr=subprocess.STDOUT, cwd=self.folder))
        self.logs[self.runners[-1].pid] = path

    def standby_warm(self) -> bool:
        """Whether a live runner other than the driving one has finished its warm-up (said a
        WARM_UP_SAID line, `cdcflow.cli.run`), so that it takes a killed runner's streams
        over warm."""
        driving = self.driving()
        for runner in self.runners:
            if runner.pid not in self.warm and runner.poll() is None and any(
                    line in self.logs[runner.pid].read_text(errors="replace")
                    for line in WARM_UP_SAID):
                self.warm.add(runner.pid)
        return any(r.pid in self.warm for r in self.runners
                   if r is not driving and r.poll() is None)

    def driving(self) -> subprocess.Popen[bytes] | None:
        """The live runner that holds the catalog's lease, if one does now."""
        lease = self.catalog.lease()
        pid = holder_pid(lease[0]) if lease else None
        return next((r for r in self.runners if r.pid == pid and r.poll() is None), None)

    def driver(self) -> subprocess.Popen[bytes]:
        """The runner that drives the streams, once one does."""
        wait_for(lambda: self.driving() is not None, 300, "a runner to hold the lease",
                 self.recent_errors)
        runner = self.driving()
        assert runner is not None
        return runner

    def kill(self, runner: subprocess.Popen[bytes] | None) -> None:
        """SIGKILL a runner, with its JVM and capture workers."""
        if runner is not None and runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait()
        self.runners = [r for r in self.runners if r.poll() is None]

    def stop_runners(self) -> None:
        """Stop every runner as a user would (SIGINT), the standbys first."""
        driving = self.driving()
        for runner in sorted(self.runners, key=lambda r: r is driving):
            if runner.poll() is None:
                os.killpg(runner.pid, signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    runner.wait(timeout=120)
            with contextlib.suppress(ProcessLookupError):  # a JVM left behind by a runner
                os.killpg(runner.pid, signal.SIGKILL)  # stopped while it started it
            runner.wait()
        self.runners = []

    def runner_pid(self) -> int | None:
        runner = self.driving()
        return runner.pid if runner is not None else None

    def batches(self) -> dict[str, int]:
        return {name: int(self.catalog.status(name).get("batches") or 0)
                for name in self.names}

    def progressed(self, since: dict[str, int], seconds: float = 300) -> float:
        """Wait until every stream is RUNNING and has finished a batch after `since`; the
        seconds it took."""
        began = time.monotonic()
        for name in self.names:
            wait_for(partial(self.ran_since, name, since[name]), seconds,
                     f"the stream {name} to run a batch again", self.recent_errors)
        return time.monotonic() - began

    def mended(self, since: dict[str, int]) -> float:
        """After a failure the machine caused: `progressed`, and then no stream still says
        it is waiting for the machine (its first batch clears that)."""
        seconds = self.progressed(since)
        wait_for(lambda: not any(self.catalog.status(name).get("waiting_for")
                                 for name in self.names), 60,
                 "the streams to stop waiting for the machine", self.recent_errors)
        return seconds

    def ran_since(self, name: str, batches: int) -> bool:
        """Whether the stream is RUNNING and has finished a batch after its `batches`th."""
        return self.catalog.get(name).state == StreamState.RUNNING and \
            self.batches()[name] > batches

    def failed_with(self, words: str, after: float) -> bool:
        """Whether a stream has failed since `after` with `words` in its error."""
        return any(e["time"] >= after and words in e["message"]
                   for name in self.names for e in self.catalog.errors(name))

    def recent_errors(self) -> list[dict[str, Any]]:
        return [e for name in self.names for e in self.catalog.errors(name)[:2]]


def wait_for(condition: Any, seconds: float, what: str, details: Any = None) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {seconds:.0f} s for {what}: "
                               f"{details() if details else ''}")
        time.sleep(0.05)


def now_seconds() -> float:
    return to_micros(SYSTEM_CLOCK.now()) / 1e6


def run_command(*command: str, busy_seconds: float = 0.0) -> None:
    """Run `command`; while it fails as busy, again until `busy_seconds` have passed."""
    deadline = time.monotonic() + busy_seconds
    while (result := subprocess.run(command, capture_output=True, text=True, timeout=60,
                                    check=False)).returncode != 0:
        if "busy" not in result.stderr or time.monotonic() > deadline:
            raise RuntimeError(f"{' '.join(command)} failed: {result.stderr.strip()}")
        time.sleep(0.05)
