"""The runner lease (issue 14, concurrency): one holder at a time, renewed by its holder,
taken over only once it has expired, given up at a clean stop."""

from __future__ import annotations

import os
import subprocess
from datetime import timedelta
from pathlib import Path

from cdcflow.clock import FakeClock
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.lease import (
    LOCAL_WATCH_SECONDS,
    STALL_SECONDS,
    STANDBY_POLL_SECONDS,
    RunnerLease,
    process_state,
)


def test_one_runner_holds_the_lease_until_it_expires_or_is_released(tmp_path: Path):
    clock = FakeClock()
    first = RunnerLease(Catalog(tmp_path / "c.db", clock), seconds=10)
    second = RunnerLease(Catalog(tmp_path / "c.db", clock), seconds=10)
    assert first.hold() and not second.hold()
    assert second.other is not None and second.other[0] == first.holder
    clock.advance(timedelta(seconds=9))
    assert first.hold() and not second.hold()  # renewed: 10 s from now again
    clock.advance(timedelta(seconds=9))
    assert not second.hold()
    clock.advance(timedelta(seconds=2))  # 11 s without a renewal: expired
    assert second.hold() and not first.hold() and second.other is None
    second.release()
    assert first.hold() and Catalog(tmp_path / "c.db", clock).lease()[0] == first.holder


def test_the_heartbeat_stops_renewing_when_the_loop_stalls(tmp_path: Path):
    """A runner whose loop has not turned for STALL_SECONDS lets its lease lapse."""
    clock = FakeClock()
    first = RunnerLease(Catalog(tmp_path / "c.db", clock), seconds=10)
    assert first.hold() and first.tick()
    clock.advance(timedelta(seconds=STALL_SECONDS + 20))
    first._beat_once()
    second = RunnerLease(Catalog(tmp_path / "c.db", clock), seconds=10)
    assert second.hold()
    first.tick()
    first._beat_once()
    assert not first.held and first.other is not None and first.other[0] == second.holder


def _holder_of(pid: int, host: str | None = None) -> str:
    import socket

    return f"{host or socket.gethostname()}:{pid}:nonce"


def _dead_pid(reap: bool) -> int:
    """A process that has ended: reaped (gone), or not yet (a zombie)."""
    import subprocess
    import time

    child = subprocess.Popen(["sleep", "60"])
    child.kill()
    if reap:
        child.wait()
        return child.pid
    deadline = time.monotonic() + 30
    while (process_state(child.pid) or ("gone", 0))[0] != "Z":
        assert time.monotonic() < deadline, "the child never became a zombie"
        time.sleep(0.01)
    return child.pid


def test_a_killed_holder_on_this_machine_is_taken_over_at_once(tmp_path: Path):
    """Its lease has not expired, but its process is gone (or a zombie): no wait."""
    import os

    clock = FakeClock()
    catalog = Catalog(tmp_path / "c.db", clock)
    for pid in (_dead_pid(reap=True), _dead_pid(reap=False)):
        catalog.take_lease(_holder_of(pid), 60)
        taker = RunnerLease(Catalog(tmp_path / "c.db", clock), seconds=10)
        assert taker.hold() and catalog.lease()[0] == taker.holder
        taker.release()
    for alive in (_holder_of(os.getpid()), _holder_of(os.getppid()),
                  _holder_of(_dead_pid(reap=True), host="another-host"), "garbled"):
        catalog.take_lease(alive, 60)
        waiting = RunnerLease(Catalog(tmp_path / "c.db", clock), seconds=10)
        assert not waiting.hold() and waiting.other == (alive, catalog.lease()[1]), alive
        catalog.release_lease(alive)


def test_a_standby_looks_at_the_lease_every_second_whatever_its_length(tmp_path: Path):
    """The holder renews three times per lease; a standby (of a 15 s lease, the default)
    looks at the catalog every second, and at a holder on this machine every tenth of a
    second, so that a killed holder is taken over soon."""
    clock = FakeClock()
    holder = RunnerLease(Catalog(tmp_path / "c.db", clock), seconds=15)
    standby = RunnerLease(Catalog(tmp_path / "c.db", clock), seconds=15)
    assert holder.hold() and not standby.hold()
    assert (holder.pause(), standby.pause()) == (5.0, LOCAL_WATCH_SECONDS)
    holder.release()
    catalog = Catalog(tmp_path / "c.db", clock)
    catalog.take_lease(_holder_of(os.getpid(), host="another-host"), 60)
    assert not standby.hold() and standby.pause() == STANDBY_POLL_SECONDS
    short = RunnerLease(Catalog(tmp_path / "c.db", clock), seconds=1.5)
    assert not short.hold() and short.pause() == 0.5  # a short lease: its own third


def test_a_standby_writes_to_the_catalog_only_when_it_is_time_or_the_holder_died(
        tmp_path: Path):
    """Its beats between looks at the catalog only watch the holder's process: no write
    while the holder lives; the beat after the holder's death takes the lease."""
    clock = FakeClock()
    catalog = Catalog(tmp_path / "c.db", clock)
    child = subprocess.Popen(["sleep", "60"])
    catalog.take_lease(_holder_of(child.pid), 60)
    standby = RunnerLease(Catalog(tmp_path / "c.db", clock), seconds=15)
    assert not standby.hold()
    looks = []
    standby.hold = lambda: looks.append(clock.now()) or False  # type: ignore[method-assign]
    for _ in range(9):
        clock.advance(timedelta(seconds=LOCAL_WATCH_SECONDS))
        standby.tick()  # the runner's loop turns as often
        standby._beat_once()
    assert looks == []  # 0.9 s: the holder lives, no look at the catalog yet
    clock.advance(timedelta(seconds=STANDBY_POLL_SECONDS))
    standby._beat_once()
    assert len(looks) == 1
    del standby.hold
    child.kill()
    child.wait()
    standby._beat_once()  # no time has passed: the holder's death alone makes it look
    assert standby.held and catalog.lease()[0] == standby.holder


def test_a_standby_still_warming_up_waits_for_a_dead_holders_lease_to_expire(tmp_path: Path):
    """Not eager (warming up), it leaves a dead holder's lease to a warm standby until the
    lease expires; then it takes it over all the same."""
    clock = FakeClock()
    catalog = Catalog(tmp_path / "c.db", clock)
    catalog.take_lease(_holder_of(_dead_pid(reap=True)), 10)
    warming = RunnerLease(Catalog(tmp_path / "c.db", clock), seconds=15)
    warming.eager = False
    assert not warming.hold()
    clock.advance(timedelta(seconds=STANDBY_POLL_SECONDS))
    warming._beat_once()
    assert not warming.held
    clock.advance(timedelta(seconds=10))  # expired
    warming._beat_once()
    assert warming.held and catalog.lease()[0] == warming.holder
