"""The runner lease (issue 14, concurrency): one holder at a time, renewed by its holder,
taken over only once it has expired, given up at a clean stop."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from cdcflow.clock import FakeClock
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.lease import STALL_SECONDS, RunnerLease


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
