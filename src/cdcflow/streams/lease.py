"""The runner lease: of the `cdcflow run` processes on one catalog, one drives its streams.

The holder renews the lease from a heartbeat thread, three times per `seconds`, so a long
turn of its loop (a Spark query starting, say) does not let it lapse; the heartbeat stops
renewing when the loop has not turned for STALL_SECONDS (a hung runner). Another runner
waits in standby and takes the lease over once it has expired: a runner that was killed, or
hung, has its streams taken over. A holder on this machine whose process is gone (killed) is
taken over at once, without waiting for its lease to expire: a standby looks at the catalog
every second, and at such a holder's process (in /proc) ten times a second. A standby that
is not `eager` (still warming up, `cdcflow.streams.warmup`) leaves a dead holder's lease to
an eager one until the lease expires: a warm standby takes over first. A runner that finds
the lease held by another stops everything it drove before it waits. Times are the catalog's
clock.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid

from cdcflow.model.timestamps import to_micros
from cdcflow.streams.catalog import Catalog

STALL_SECONDS = 600.0
STANDBY_POLL_SECONDS = 1.0
"""How often a standby looks at the lease in the catalog at most, whatever the lease's
length."""
LOCAL_WATCH_SECONDS = 0.1
"""How often a standby looks whether a holder on this machine is still alive, which costs a
look at /proc, not a catalog write: a holder killed is taken over within about this long."""


class RunnerLease:
    def __init__(self, catalog: Catalog, seconds: float = 15.0) -> None:
        self.catalog = catalog
        self.seconds = seconds
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.held = False
        self.eager = True
        """Whether it takes a dead holder's lease at once (else only once it expires)."""
        self.other: tuple[str, float] | None = None
        """Who holds the lease while this runner waits, and until when."""
        self._ticked = self._now()
        self._looked = float("-inf")
        """When this runner last took or renewed the lease, or tried to."""
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def _now(self) -> float:
        return to_micros(self.catalog.clock.now()) / 1e6

    def hold(self) -> bool:
        """Take or renew the lease; whether this runner holds it now."""
        self._looked = self._now()
        holder, until = self.catalog.take_lease(self.holder, self.seconds)
        if holder != self.holder and self.eager and gone_from_this_machine(holder):
            holder, until = self.catalog.take_lease(self.holder, self.seconds, holder)
        self.held = holder == self.holder
        self.other = None if self.held else (holder, until)
        return self.held

    def start(self) -> None:
        """Take the lease if it is free, then keep renewing (or trying) in the background."""
        self.hold()
        self._heartbeat = threading.Thread(target=self._beat, name="cdcflow-lease",
                                           daemon=True)
        self._heartbeat.start()

    def tick(self) -> bool:
        """The runner's loop turned; whether this runner holds the lease."""
        self._ticked = self._now()
        return self.held

    def pause(self) -> float:
        """Seconds until the next beat: the holder renews three times per lease; a standby
        beats every LOCAL_WATCH_SECONDS while the holder is on this machine (it watches the
        holder's process), else as often as it looks at the catalog (`_look_every`)."""
        if self.held:
            return self.seconds / 3
        if self.other is not None and holder_pid(self.other[0]) is not None:
            return LOCAL_WATCH_SECONDS
        return self._look_every()

    def _look_every(self) -> float:
        """How often a standby looks at the catalog: at least every STANDBY_POLL_SECONDS, so
        that it notices an expired lease soon."""
        return min(self.seconds / 3, STANDBY_POLL_SECONDS)

    def _beat(self) -> None:
        while not self._stop.wait(self.pause()):
            try:
                self._beat_once()
            except Exception:  # the catalog is busy or away: try again next beat
                continue

    def _beat_once(self) -> None:
        """Renew (or try to take) the lease, unless the loop has stalled; a standby tries
        when it is time to look at the catalog again, or at once when the holder on this
        machine has died."""
        if self._now() - self._ticked >= STALL_SECONDS:
            return
        if self.held or self.other is None or self._now() - self._looked >= \
                self._look_every() or (self.eager and gone_from_this_machine(self.other[0])):
            self.hold()

    def release(self) -> None:
        """Stop renewing and give the lease up at once (a clean stop), so that a standby
        runner takes over now."""
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=self.seconds)
        if self.held:
            self.catalog.release_lease(self.holder)
        self.held = False


def gone_from_this_machine(holder: str) -> bool:
    """Whether `holder` ("host:pid:nonce") is a runner of this machine whose process has
    ended (no such process, or a zombie nobody has reaped yet)."""
    pid = holder_pid(holder)
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # someone else's live process
        return False
    found = process_state(pid)
    return found is not None and found[0] == "Z"


def holder_pid(holder: str) -> int | None:
    """The process id of `holder` ("host:pid:nonce") if it is a runner of this machine."""
    parts = holder.rsplit(":", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return None
    return int(parts[1])


def process_state(pid: int) -> tuple[str, int] | None:
    """A live or zombie process's state letter ("Z": a zombie) and parent pid, from
    /proc; None when there is no such process (or no /proc)."""
    fields = stat_fields(pid)
    return None if fields is None else (fields[0], int(fields[1]))


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name: state, parent pid, process
    group, session...; None when there is no such process (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rpartition(")")[2].split()
    except OSError:
        return None
