"""What a watcher watches: tables, each with its commit-timestamp column and, optionally, a
shard column and the shard values its polls ask for (CW-5's fixed shard provider)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WatchedTable:
    name: str
    commit_timestamp_column: str
    shard_column: str | None = None
    shard_values: tuple[int, ...] | None = None
    """The values every poll restricts the shard column to (`ShardId IN (...)`)."""


@dataclass(frozen=True, slots=True)
class WatcherConfig:
    """A watcher over an embedded database file (`database`)."""

    database: str
    tables: tuple[WatchedTable, ...]
    log_path: str
    poll_interval_seconds: float = 1.0
    adaptive: bool = True
    """Poll again at once after a full page, and between 0.1 s and the interval after
    rounds that found rows; back off towards the interval while idle."""
    page_rows: int = 1_000
    chunk_rows: int = 5_000

    def table(self, name: str) -> WatchedTable:
        return next(t for t in self.tables if t.name == name)
