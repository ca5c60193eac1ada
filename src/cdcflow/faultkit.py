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
(`cdcflow.faultkit_pg`). Needs root for the mounts.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from cdcflow.clock import SYSTEM_CLOCK
from cdcflow.faultkit_pg import PG_KINDS, PG_NAME, Companion, PostgresSide
from cdcflow.model.partitions import PartitionPolicy
from cdcflow.model.timestamps import to_micros
from cdcflow.store.database import Database
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.states import StreamState
from cdcflow.streams.verify import verify
from cdcflow.testing import WORKLOAD_DDL

KINDS = ("kill-runner", "kill-mid-apply", "kill-mid-events", "disk-full", "read-only")
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
    injected: dict[str, int] = field(default_factory=dict)
    recoveries: dict[str, list[float]] = field(default_factory=dict)

    def schedule(self) -> list[str]:
        """The kinds of the faults, in the order they come."""
        if self.counts is None:
            return [self.kinds[number % len(self.kinds)] for number in range(self.faults)]
        left, order = dict(self.counts), []
        while any(left.values()):
            for kind in self.counts:
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
        self.runner: subprocess.Popen[bytes] | None = None
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
                {"kind": "cdc_table", "warehouse": str(self.dest / "warehouse")},
                {"kind": "event_files", "root": str(self.dest / "events"), "max_events": 500}],
            "spark": {"trigger_seconds": 0.3, "max_records_per_trigger": 300}}))
        self.catalog.act(NAME, "start")
        if self.pg is not None:
            self.pg.setup(self.catalog)

    def writer_targets(self) -> list[str]:
        """What each writer writes to: the database file, and the PostgreSQL DSN."""
        return [self.db_path] + ([self.pg.dsn()] if self.pg is not None else [])

    def teardown(self) -> None:
        self.kill_runner()
        with contextlib.suppress(RuntimeError):
            _run("umount", "-l", str(self.dest))
        if self.pg is not None:
            self.pg.teardown()

    # ---- processes -------------------------------------------------------------------------

    def start_runner(self) -> None:
        self.starts += 1
        log = (self.folder / f"runner-{self.starts}.log").open("wb")
        self.runner = subprocess.Popen(
            [sys.executable, "-m", "cdcflow.cli.main", "run", "--catalog",
             str(self.folder / "catalog.db"), "--master", "local[2]", "--json",
             "--lease-seconds", "3"], start_new_session=True, stdout=log,
            stderr=subprocess.STDOUT, cwd=self.folder)
        log.close()

    def kill_runner(self) -> None:
        if self.runner is not None and self.runner.poll() is None:
            os.killpg(self.runner.pid, signal.SIGKILL)
            self.runner.wait()

    def stop_runner(self) -> None:
        if self.runner is not None and self.runner.poll() is None:
            os.killpg(self.runner.pid, signal.SIGINT)
            try:
                self.runner.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.kill_runner()

    def runner_pid(self) -> int | None:
        return self.runner.pid if self.runner is not None and self.runner.poll() is None \
            else None

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


def _run(*command: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {result.stderr.strip()}")


# ---- faults ---------------------------------------------------------------------------------

def inject(rig: Rig, kind: str) -> float:
    """One fault, mended; the seconds from the mend (a killed runner started again, the disk
    freed...) until every stream it hit has run a batch again. The batch count is read only
    once the fault has stopped every stream it hits, so no batch from before counts."""
    match kind:
        case "kill-runner":
            time.sleep(rig.rng.uniform(0, 2))  # a random moment of the stream's work
            rig.kill_runner()
        case "kill-mid-apply":
            _when(lambda: _apply_running(rig.dest), 30)
            rig.kill_runner()
        case "kill-mid-events":
            _when(lambda: any(rig.dest.glob("*events/**/.*.tmp")), 30)
            rig.kill_runner()
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
    before = rig.batches()  # the runner is dead: no batch runs until it is back
    rig.start_runner()
    return rig.progressed(before)


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
    unmounted."""
    began = _now()
    _run("mount", "--bind", str(rig.dest), str(rig.dest))
    try:
        _run("mount", "-o", "remount,bind,ro", str(rig.dest))
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
        rig.stop_runner()
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


def figures(campaign: Campaign, reports: dict[str, dict[str, Any]], counts_files: list[Path],
            seconds: float) -> dict[str, Any]:
    import json

    counts = [json.loads(f.read_text()) for f in counts_files if f.exists()]
    objects = [o for report in reports.values() for o in report["objects"]]
    lost = sum(o[side].get("missing", 0) + o[side].get("differ", 0)
               for o in objects for side in ("cdc_table", "events"))
    duplicated = sum(o[side].get("extra", 0) + o[side].get("duplicated", 0)
                     for o in objects for side in ("cdc_table", "events"))
    every = [r for kind in campaign.recoveries.values() for r in kind]
    return {
        "faults": campaign.injected, "faults_total": sum(campaign.injected.values()),
        "transactions_committed": sum(c.get("transactions", 0) for c in counts),
        "changes_committed": sum(c.get("changes", 0) for c in counts),
        "changes_lost": lost, "changes_duplicated": duplicated,
        "duplicate_event_uuids": sum(o["events"].get("duplicate_uuids", 0) for o in objects),
        "verify_equal": all(report["equal"] for report in reports.values()),
        "verify": reports, "wall_seconds": round(seconds, 1),
        "recovery_p50_seconds": _percentile(every, 0.5),
        "recovery_p99_seconds": _percentile(every, 0.99),
        "recovery_p50_by_kind": {kind: _percentile(found, 0.5)
                                 for kind, found in campaign.recoveries.items()},
    }


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values) or [0.0]
    if fraction == 0.5:
        return round(statistics.median(ordered), 2)
    return round(ordered[int(fraction * (len(ordered) - 1))], 2)


if __name__ == "__main__":  # pragma: no cover - bench/faults.py is the entry point
    raise SystemExit("run bench/faults.py")
