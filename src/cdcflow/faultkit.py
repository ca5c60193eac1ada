"""The fault campaign (issue 14): a mixed workload into the embedded database (and, with
`postgres`, another into PostgreSQL) streams into CDC tables and event files on a 512 MB
tmpfs, driven by one `cdcflow run`, while faults are injected at random times, and each is
mended the way a user would (start the runner again, free the disk, make the folder
writable). At the end each stream is drained and `cdcflow verify` says whether anything was
lost or duplicated. `bench/faults.py` runs it long; the test suite runs a short one.

Faults: kill-runner (SIGKILL `cdcflow run` with its JVM at a random moment), kill-mid-apply
(SIGKILL while a CDC-table apply holds its lock), kill-mid-events (SIGKILL while an event
file is being written), disk-full (the destination's tmpfs filled up), read-only (the
destination remounted read-only); with PostgreSQL also kill-capture and restart-postgres
(`cdcflow.faultkit_pg`). With `standbys`, more `cdcflow run`s wait on the catalog's lease
and take a killed runner's streams over; the runner started again stands by in its turn.
Needs root for the mounts.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

from cdcflow.clock import SYSTEM_CLOCK
from cdcflow.faultkit_figures import figures
from cdcflow.faultkit_pg import (
    APPLY_STALENESS_SECONDS,
    PG_KINDS,
    PG_NAME,
    STREAM_SPARK,
    Companion,
    PostgresSide,
)
from cdcflow.model.partitions import PartitionPolicy
from cdcflow.model.timestamps import to_micros
from cdcflow.store.database import Database
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.lease import holder_pid
from cdcflow.streams.states import StreamState
from cdcflow.streams.verify import verify
from cdcflow.testing import WORKLOAD_DDL

RUNNER_KILLS = ("kill-runner", "kill-mid-apply", "kill-mid-events")
KINDS = (*RUNNER_KILLS, "disk-full", "read-only")
ALL_KINDS = KINDS + PG_KINDS
NAME = "faults"


@dataclass
class Campaign:
    folder: Path
    faults: int = 100
    """Faults of `kinds`, in turn; with `postgres` each has a PostgreSQL fault for company."""
    kinds: tuple[str, ...] = KINDS
    seed: int = 1
    tmpfs_mb: int = 512  # the events of a long campaign fill 64 MB (then the disk stays full)
    writer_rate: float = 40.0
    postgres: bool = False
    counts: dict[str, int] | None = None
    """Instead of `faults` of `kinds`: how many of each kind (interleaved)."""
    standbys: int = 0
    """`cdcflow run`s in standby beside the one that drives the streams, as a user who wants
    fast failover would run them: a standby takes a killed runner's streams over, and the
    runner started again (once they run again) stands by in its turn. Without, the runner
    started again takes over."""
    injected: dict[str, int] = field(default_factory=dict)
    recoveries: dict[str, list[float]] = field(default_factory=dict)

    def schedule(self) -> list[str]:
        """The kinds of the faults, in the order they come: `kinds` in turn; or `counts`,
        each kind in turn among the runner kills and among the others, with the runner
        kills spread evenly among the others (a runner started again has the faults
        between to start in)."""
        if self.counts is None:
            return [self.kinds[number % len(self.kinds)] for number in range(self.faults)]
        kills = _in_turn({k: n for k, n in self.counts.items() if k in RUNNER_KILLS})
        others = _in_turn({k: n for k, n in self.counts.items() if k not in RUNNER_KILLS})
        slots = sorted([((i + 0.5) / len(kills), 0, kind) for i, kind in enumerate(kills)] +
                       [((i + 0.5) / len(others), 1, kind) for i, kind in enumerate(others)])
        return [kind for _, _, kind in slots]


def _in_turn(counts: dict[str, int]) -> list[str]:
    left, order = dict(counts), []
    while any(left.values()):
        for kind in counts:
            if left[kind] > 0:
                order.append(kind)
                left[kind] -= 1
    return order


class Rig:
    """The system under faults: database, catalog, destination mount, runner, writer."""

    def __init__(self, campaign: Campaign) -> None:
        self.campaign = campaign
        self.folder = campaign.folder
        self.dest = self.folder / "dest"
        self.runners: list[subprocess.Popen[bytes]] = []
        self.starts = 0
        self.rng = random.Random(campaign.seed)
        self.names = [NAME, PG_NAME] if campaign.postgres else [NAME]
        self.pg = PostgresSide(self.dest, wait_for, _now) if campaign.postgres else None

    def setup(self) -> None:
        self.dest.mkdir(parents=True, exist_ok=True)
        _run("mount", "-t", "tmpfs", "-o", f"size={self.campaign.tmpfs_mb}m", "tmpfs",
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
            _run("umount", "-l", str(self.dest))
        if self.pg is not None:
            self.pg.teardown()

    # ---- processes -------------------------------------------------------------------------

    def start_runner(self) -> None:
        """Start one more `cdcflow run`: the one that drives the streams, or (while another
        holds the lease) a standby that takes over once that one dies."""
        self.starts += 1
        log = (self.folder / f"runner-{self.starts}.log").open("wb")
        self.runners.append(subprocess.Popen(
            [sys.executable, "-m", "cdcflow.cli.main", "run", "--catalog",
             str(self.folder / "catalog.db"), "--master", "local[2]", "--json",
             "--lease-seconds", "3"], start_new_session=True, stdout=log,
            stderr=subprocess.STDOUT, cwd=self.folder))
        log.close()

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


def _now() -> float:
    return to_micros(SYSTEM_CLOCK.now()) / 1e6


def _run(*command: str, busy_seconds: float = 0.0) -> None:
    """Run `command`; while it fails as busy, again until `busy_seconds` have passed."""
    deadline = time.monotonic() + busy_seconds
    while (result := subprocess.run(command, capture_output=True, text=True, timeout=60,
                                    check=False)).returncode != 0:
        if "busy" not in result.stderr or time.monotonic() > deadline:
            raise RuntimeError(f"{' '.join(command)} failed: {result.stderr.strip()}")
        time.sleep(0.05)


# ---- faults ---------------------------------------------------------------------------------

def inject(rig: Rig, kind: str) -> float:
    """One fault, mended; the seconds from the mend (a killed runner started again, the disk
    freed...) until every stream it hit has run a batch again. The batch count is read only
    once the fault has stopped every stream it hits, so no batch from before counts."""
    match kind:
        case "kill-runner" | "kill-mid-apply" | "kill-mid-events":
            victim = rig.driver()  # found first: the moment to kill may be short
            _moment_to_kill(rig, kind)
            rig.kill(victim)
        case "disk-full":
            return _disk_full(rig)
        case "read-only":
            return _read_only(rig)
        case "kill-capture" if rig.pg is not None:
            return rig.pg.kill_capture(rig.runner_pid)
        case "restart-postgres" if rig.pg is not None:
            return rig.pg.restart_server()
        case _:
            raise ValueError(f"no such fault here: {kind!r}")
    before = rig.batches()  # the runner is dead: no batch runs until one takes over
    if not rig.campaign.standbys:
        rig.start_runner()  # started again, it takes over
        return rig.progressed(before)
    seconds = rig.progressed(before)  # a standby took over
    rig.start_runner()  # started again once the streams run: it stands by
    return seconds


def _moment_to_kill(rig: Rig, kind: str) -> None:
    if kind == "kill-runner":
        time.sleep(rig.rng.uniform(0, 2))  # a random moment of the stream's work
    elif kind == "kill-mid-apply":
        _when(lambda: _apply_running(rig.dest), 30)
    else:
        _when(lambda: _event_write_running(rig.dest), 30)


def _when(condition: Any, seconds: float) -> bool:
    """Poll for the moment `condition` holds (at most `seconds`): the fault lands then."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.001)
    return False


def _apply_running(dest: Path) -> bool:
    for lock in dest.glob("*warehouse/*/_cdcflow/apply.lock"):
        with open(lock, "w") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def _event_write_running(dest: Path) -> bool:
    """Whether an event file or a batch manifest is being written: a `.<name>.tmp` in a
    `_manifests` folder or in an object's folder of this minute or the one before (events
    go by their commit's minute). Only those folders are read, so that the moment, a few
    microseconds per file, is not missed while a glob walks every folder written so far."""
    now = SYSTEM_CLOCK.now()
    minutes = {moment.strftime("%Y/%m/%d/%H/%M") for moment in (now, now - timedelta(minutes=1))}
    for stream in [s for root in dest.glob("*events") for s in _folders(root)]:
        folders = [stream / "_manifests"] + [obj / minute for obj in _folders(stream)
                                             for minute in minutes]
        if any(_writing_in(folder) for folder in folders):
            return True
    return False


def _folders(folder: Path) -> list[Path]:
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        return [Path(e.path) for e in entries if e.is_dir() and not e.name.startswith("_")]
    return []


def _writing_in(folder: Path) -> bool:
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        return any(e.name.startswith(".") and e.name.endswith(".tmp") for e in entries)
    return False


def _disk_full(rig: Rig) -> float:
    began = _now()
    ballast = rig.dest / "ballast"
    with contextlib.suppress(OSError), open(ballast, "wb") as handle:
        while True:
            handle.write(b"\0" * 1024 * 1024)
            handle.flush()
    wait_for(lambda: rig.failed_with("the disk is full", began), 180,
             "a stream to fail on the full disk", rig.recent_errors)
    before = rig.batches()
    ballast.unlink()
    return rig.mended(before)


def _read_only(rig: Rig) -> float:
    """The destination folder becomes read-only for a while: a read-only bind mount over it
    (a remount of the tmpfs itself is refused while a file is open for writing), then
    unmounted. A writer that opens a file through the new mount before it turns read-only
    makes that remount busy until it closes the file: it is tried again meanwhile."""
    began = _now()
    _run("mount", "--bind", str(rig.dest), str(rig.dest))
    try:
        _run("mount", "-o", "remount,bind,ro", str(rig.dest), busy_seconds=30)
        wait_for(lambda: rig.failed_with("read-only", began), 180,
                 "a stream to fail on the read-only folder", rig.recent_errors)
        before = rig.batches()
    finally:
        _run("umount", "-l", str(rig.dest))
    return rig.mended(before)


# ---- the campaign ---------------------------------------------------------------------------

def run_campaign(campaign: Campaign) -> dict[str, Any]:
    """Run it; the figures (see the module docstring)."""
    began = time.monotonic()
    rig = Rig(campaign)
    stop_file = campaign.folder / "stop-writer"
    writers: list[subprocess.Popen[bytes]] = []
    try:
        rig.setup()
        writers = [_start_writer(campaign, target, number, stop_file)
                   for number, target in enumerate(rig.writer_targets())]
        for _ in range(1 + campaign.standbys):
            rig.start_runner()
        for name in rig.names:
            wait_for(partial(rig.ran_since, name, -1), 300, f"the stream {name} to run",
                     rig.recent_errors)
        for number, kind in enumerate(campaign.schedule()):
            _fault_round(rig, campaign, number, kind)
        stop_file.touch()
        for writer in writers:
            writer.wait(timeout=300)
        reports = {name: verify(rig.catalog, name, wait_seconds=600) for name in rig.names}
    finally:
        stop_file.touch()
        for writer in writers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                writer.wait(timeout=60)
        rig.stop_runners()
        rig.teardown()
    counts = [campaign.folder / f"writer-{n}.json" for n in range(len(writers))]
    return figures(campaign, reports, counts, time.monotonic() - began)


def _fault_round(rig: Rig, campaign: Campaign, number: int, kind: str) -> None:
    """One fault of `kind`; with PostgreSQL, a fault of its own kinds (in turn) lands at a
    random moment meanwhile."""
    companion = None
    if rig.pg is not None and kind not in PG_KINDS:
        companion = Companion(rig.pg, PG_KINDS[number % len(PG_KINDS)], rig.rng,
                              rig.runner_pid)
        companion.start()
    found = [(kind, inject(rig, kind))]
    if companion is not None:
        found.append((companion.kind, companion.outcome()))
    for done, seconds in found:
        campaign.recoveries.setdefault(done, []).append(seconds)
        campaign.injected[done] = campaign.injected.get(done, 0) + 1


def _start_writer(campaign: Campaign, target: str, number: int,
                  stop_file: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([
        sys.executable, "-c", "import sys; from cdcflow.workload_faults import main; "
        "main(sys.argv[1:])", target, str(stop_file),
        str(campaign.folder / f"writer-{number}.json"), str(campaign.seed + number),
        str(campaign.writer_rate)])


if __name__ == "__main__":  # pragma: no cover - bench/faults.py is the entry point
    raise SystemExit("run bench/faults.py")
