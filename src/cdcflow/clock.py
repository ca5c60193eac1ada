"""Time as an injected dependency: logic asks a `Clock`, never `datetime.now()` itself."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    """A source of the current UTC time."""

    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait `seconds` of this clock's time."""
        ...


class SystemClock:
    """The wall clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class FakeClock:
    """A clock that moves only when told to; `sleep` advances it instead of waiting."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, delta: timedelta) -> datetime:
        with self._lock:
            self._now += delta
            return self._now

    def sleep(self, seconds: float) -> None:
        self.advance(timedelta(seconds=seconds))


SYSTEM_CLOCK = SystemClock()
