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
and take a killed runner's streams over; the runner started again stands by in its turn. A
runner is then killed only once a standby has warmed up (`cdcflow.streams.warmup`), so
that each takeover is a warm standby's.
Needs root for the mounts.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
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
from cdcflow.faultkit_pg import PG_KINDS, Companion
from cdcflow.faultkit_rig import NAME, Rig, now_seconds, run_command, wait_for
from cdcflow.streams.verify import verify

__all__ = ["ALL_KINDS", "KINDS", "NAME", "Campaign", "run_campaign", "wait_for"]

RUNNER_KILLS = ("kill-runner", "kill-mid-apply", "kill-mid-events")
KINDS = (*RUNNER_KILLS, "disk-full", "read-only")
ALL_KINDS = KINDS + PG_KINDS


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


# ---- faults ---------------------------------------------------------------------------------

def inject(rig: Rig, kind: str) -> float:
    """One fault, mended; the seconds from the mend (a killed runner started again, the disk
    freed...) until every stream it hit has run a batch again. The batch count is read only
    once the fault has stopped every stream it hits, so no batch from before counts."""
    match kind:
        case "kill-runner" | "kill-mid-apply" | "kill-mid-events":
            if rig.campaign.standbys:
                wait_for(rig.standby_warm, 120, "a standby to warm up")
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
        time.sleep(rig.rng.uniform(0, 1))  # a random moment of the stream's work: a few
    elif kind == "kill-mid-apply":  # batches (0.3 s apart) in that second
        _when(lambda: _apply_running(rig.dest), 30)
    else:
        _event_write_moment(rig.dest, 30)


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


def _event_write_moment(dest: Path, seconds: float) -> bool:
    """Wait (at most `seconds`) for the moment an event file or a batch manifest is being
    written: a `.<name>.<random>.tmp` created in a `_manifests` folder or in an object's
    folder of this minute or the one before (events go by their commit's minute). inotify
    says so at once; a poll of the folders missed most such files, which live for a
    fraction of a millisecond, and took about 3 s to find one."""
    from inotify_simple import INotify, flags

    deadline = time.monotonic() + seconds
    with INotify() as watcher:
        watched: set[Path] = set()
        while time.monotonic() < deadline:
            for folder in set(_event_folders(dest)) - watched:
                with contextlib.suppress(OSError):  # not made yet: watched once it is
                    watcher.add_watch(str(folder), flags.CREATE)
                    watched.add(folder)
            if any(e.name.startswith(".") and e.name.endswith(".tmp")
                   for e in watcher.read(timeout=100)):
                return True
    return False


def _event_folders(dest: Path) -> list[Path]:
    """Where event files and manifests are written now (see `_event_write_moment`)."""
    now = SYSTEM_CLOCK.now()
    minutes = {moment.strftime("%Y/%m/%d/%H/%M") for moment in (now, now - timedelta(minutes=1))}
    return [folder for root in dest.glob("*events") for stream in _folders(root)
            for folder in [stream / "_manifests"] + [obj / minute for obj in _folders(stream)
                                                     for minute in minutes]]


def _folders(folder: Path) -> list[Path]:
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        return [Path(e.path) for e in entries if e.is_dir() and not e.name.startswith("_")]
    return []


def _disk_full(rig: Rig) -> float:
    began = now_seconds()
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
    began = now_seconds()
    run_command("mount", "--bind", str(rig.dest), str(rig.dest))
    try:
        run_command("mount", "-o", "remount,bind,ro", str(rig.dest), busy_seconds=30)
        wait_for(lambda: rig.failed_with("read-only", began), 180,
                 "a stream to fail on the read-only folder", rig.recent_errors)
        before = rig.batches()
    finally:
        run_command("umount", "-l", str(rig.dest))
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
