"""The fault campaign (issue 14): a mixed workload into the embedded database streams into a
CDC table and event files on a 512 MB tmpfs, while faults are injected at random times, and
each is mended the way a user would (start the runner again, free the disk, make the folder
writable). At the end the stream is drained and `cdcflow verify` says whether anything was
lost or duplicated. `bench/faults.py` runs it long; the test suite runs a short one.

Faults: kill-runner (SIGKILL `cdcflow run` with its JVM at a random moment), kill-mid-apply
(SIGKILL while a CDC-table apply holds its lock), kill-mid-events (SIGKILL while an event
file is being written), disk-full (the destination's tmpfs filled up), read-only (the
destination remounted read-only). Needs root for the mounts.
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
from pathlib import Path
from typing import Any

from cdcflow.clock import SYSTEM_CLOCK
from cdcflow.model.partitions import PartitionPolicy
from cdcflow.model.timestamps import to_micros
from cdcflow.store.database import Database
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.states import StreamState
from cdcflow.streams.verify import verify
from cdcflow.testing import WORKLOAD_DDL

KINDS = ("kill-runner", "kill-mid-apply", "kill-mid-events", "disk-full", "read-only")
NAME = "faults"


@dataclass
class Campaign:
    folder: Path
    faults: int = 100
    kinds: tuple[str, ...] = KINDS
    seed: int = 1
    tmpfs_mb: int = 512  # the events of a long campaign fill 64 MB (then the disk stays full)
    writer_rate: float = 40.0
    injected: dict[str, int] = field(default_factory=dict)
    recoveries: list[float] = field(default_factory=list)


class Rig:
    """The system under faults: database, catalog, destination mount, runner, writer."""

    def __init__(self, campaign: Campaign) -> None:
        self.campaign = campaign
        self.folder = campaign.folder
        self.dest = self.folder / "dest"
        self.runner: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.rng = random.Random(campaign.seed)

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

    def teardown(self) -> None:
        self.kill_runner()
        with contextlib.suppress(RuntimeError):
            _run("umount", "-l", str(self.dest))

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

    def batches(self) -> int:
        return int(self.catalog.status(NAME).get("batches") or 0)

    def progressed(self, since: int, seconds: float = 300) -> float:
        """Wait until the stream is RUNNING and has finished a batch after `since`; the
        seconds it took."""
        began = time.monotonic()
        wait_for(lambda: self.catalog.get(NAME).state == StreamState.RUNNING and
                 self.batches() > since, seconds, "the stream to run a batch again",
                 lambda: self.catalog.errors(NAME)[-3:])
        return time.monotonic() - began


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
    """One fault, mended; the seconds until the stream ran a batch again."""
    before = rig.batches()
    match kind:
        case "kill-runner":
            time.sleep(rig.rng.uniform(0, 2))  # a random moment of the stream's work
            rig.kill_runner()
        case "kill-mid-apply":
            _when(lambda: _apply_running(rig.dest / "warehouse"), 30)
            rig.kill_runner()
        case "kill-mid-events":
            _when(lambda: any((rig.dest / "events").rglob(".*.tmp")), 30)
            rig.kill_runner()
        case "disk-full":
            return _disk_full(rig, before)
        case "read-only":
            return _read_only(rig, before)
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


def _apply_running(warehouse: Path) -> bool:
    for lock in warehouse.glob("*/_cdcflow/apply.lock"):
        with open(lock, "w") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def _failed_with(rig: Rig, words: str, after: float) -> bool:
    return any(e["time"] >= after and words in e["message"] for e in rig.catalog.errors(NAME))


def _disk_full(rig: Rig, before: int) -> float:
    began = _now()
    ballast = rig.dest / "ballast"
    with contextlib.suppress(OSError), open(ballast, "wb") as handle:
        while True:
            handle.write(b"\0" * 1024 * 1024)
            handle.flush()
    wait_for(lambda: _failed_with(rig, "the disk is full", began), 180,
             "the stream to fail on the full disk", lambda: rig.catalog.errors(NAME)[-2:])
    ballast.unlink()
    return rig.progressed(before)


def _read_only(rig: Rig, before: int) -> float:
    """The destination folder becomes read-only for a while: a read-only bind mount over it
    (a remount of the tmpfs itself is refused while a file is open for writing), then
    unmounted."""
    began = _now()
    _run("mount", "--bind", str(rig.dest), str(rig.dest))
    try:
        _run("mount", "-o", "remount,bind,ro", str(rig.dest))
        wait_for(lambda: _failed_with(rig, "read-only", began), 180,
                 "the stream to fail on the read-only folder",
                 lambda: rig.catalog.errors(NAME)[-2:])
    finally:
        _run("umount", "-l", str(rig.dest))
    return rig.progressed(before)


# ---- the campaign ---------------------------------------------------------------------------

def run_campaign(campaign: Campaign) -> dict[str, Any]:
    """Run it; the figures (see the module docstring)."""
    began = time.monotonic()
    rig = Rig(campaign)
    rig.setup()
    stop_file = campaign.folder / "stop-writer"
    counts_file = campaign.folder / "writer-counts.json"
    writer = subprocess.Popen([sys.executable, "-c", "import sys; from cdcflow.workload_faults "
                               "import main; main(sys.argv[1:])", rig.db_path, str(stop_file),
                               str(counts_file), str(campaign.seed), str(campaign.writer_rate)])
    try:
        rig.start_runner()
        wait_for(lambda: rig.catalog.get(NAME).state == StreamState.RUNNING, 300,
                 "the stream to run", lambda: rig.catalog.errors(NAME)[-3:])
        for number in range(campaign.faults):
            kind = campaign.kinds[number % len(campaign.kinds)]
            campaign.recoveries.append(inject(rig, kind))
            campaign.injected[kind] = campaign.injected.get(kind, 0) + 1
        stop_file.touch()
        writer.wait(timeout=300)
        report = verify(rig.catalog, NAME, wait_seconds=600)
    finally:
        stop_file.touch()
        with contextlib.suppress(subprocess.TimeoutExpired):
            writer.wait(timeout=60)
        rig.stop_runner()
        rig.teardown()
    return figures(campaign, report, counts_file, time.monotonic() - began)


def figures(campaign: Campaign, report: dict[str, Any], counts_file: Path,
            seconds: float) -> dict[str, Any]:
    import json

    counts = json.loads(counts_file.read_text()) if counts_file.exists() else {}
    objects = report["objects"]
    lost = sum(o[side].get("missing", 0) + o[side].get("differ", 0)
               for o in objects for side in ("cdc_table", "events"))
    duplicated = sum(o[side].get("extra", 0) + o[side].get("duplicated", 0)
                     for o in objects for side in ("cdc_table", "events"))
    recoveries = sorted(campaign.recoveries) or [0.0]
    return {
        "faults": campaign.injected, "faults_total": sum(campaign.injected.values()),
        "transactions_committed": counts.get("transactions", 0),
        "changes_committed": counts.get("changes", 0),
        "changes_lost": lost, "changes_duplicated": duplicated,
        "duplicate_event_uuids": sum(o["events"].get("duplicate_uuids", 0) for o in objects),
        "verify_equal": report["equal"], "verify": report,
        "wall_seconds": round(seconds, 1),
        "recovery_p50_seconds": round(statistics.median(recoveries), 2),
        "recovery_p99_seconds": round(recoveries[int(0.99 * (len(recoveries) - 1))], 2),
    }


if __name__ == "__main__":  # pragma: no cover - bench/faults.py is the entry point
    raise SystemExit("run bench/faults.py")
