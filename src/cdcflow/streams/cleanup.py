"""The watcher's cleanup (CW-6): old rows leave the null-filtered index when their commit
timestamp is set to NULL by a partitioned update (`cdcflow watcher cleanup`, or `cleanup`).

It refuses an age shorter than the watcher's lag (how far its horizon is behind now) plus
one poll interval, and never touches a row newer than the horizon the watcher has read up
to: a row whose timestamp it erased before the watcher polled it would never be seen. Rows
that other writers update at the same time must not be cleaned (the seed's warning, see
`cdcflow.store.partitioned`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from cdcflow.capture.watcher.source import WatcherSource as WatcherChangeSource
from cdcflow.clock import SYSTEM_CLOCK, Clock
from cdcflow.errors import FailedPrecondition, InvalidArgument
from cdcflow.model.timestamps import from_micros, to_micros
from cdcflow.store.changelog import ChangeLog
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import WatcherSource
from cdcflow.streams.sources import open_source


@dataclass(frozen=True, slots=True)
class Cleaned:
    table: str
    cutoff: str
    rows: int


def cleanup(catalog: Catalog, name: str, table: str, older_than: timedelta,
            batch_rows: int = 1_000, clock: Clock = SYSTEM_CLOCK) -> Cleaned:
    """Set the commit timestamp of `table`'s rows older than `older_than` to NULL."""
    definition = catalog.get(name).definition
    if not isinstance(definition.source, WatcherSource):
        raise FailedPrecondition(f"stream {name!r} reads a {definition.source.kind} source; "
                                 "cleanup is for watcher streams")
    watched = {t.name: t for t in definition.source.tables}
    if table not in watched:
        raise InvalidArgument(f"table {table!r} is not watched by stream {name!r} (tables "
                              f"{sorted(watched)})")
    source = open_source(definition, Path(catalog.path).resolve().parent)
    assert isinstance(source, WatcherChangeSource)
    try:
        log = ChangeLog.open(source.log_location()[0], create=False) if Path(
            source.log_location()[0]).exists() else None
        stored = None if log is None else log.position(source.source_id)
        if stored is None:
            raise FailedPrecondition(f"stream {name!r} has not polled yet: there is nothing "
                                     "it has read that a cleanup could take out")
        horizon = from_micros(int(stored.position["horizon"]))
        now = clock.now()
        shortest = (now - horizon) + timedelta(seconds=definition.source.poll_interval_seconds)
        if older_than < shortest:
            raise InvalidArgument(
                f"cleanup age {older_than.total_seconds():.1f} s is shorter than the watcher's "
                f"lag plus one poll interval ({shortest.total_seconds():.1f} s): rows it has "
                "not polled yet would lose their commit timestamp and never be seen")
        cutoff = min(now - older_than, horizon)
        rows = source.target.clean(source.config.table(table), to_micros(cutoff), batch_rows)
        return Cleaned(table, cutoff.isoformat(), rows)
    finally:
        source.close()
