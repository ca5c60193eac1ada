"""What a watcher watches: a target database, its tables, each with its commit-timestamp
column and, optionally, a shard column and the shard values its polls ask for (CW-5's fixed
shard provider), a soft-delete column, or (PostgreSQL) a trigger-fed table of deletes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class WatchedTable:
    name: str
    commit_timestamp_column: str
    shard_column: str | None = None
    shard_values: tuple[int, ...] | None = None
    """The values every poll restricts the shard column to (`ShardId IN (...)`)."""
    soft_delete_column: str | None = None
    """A boolean column: a row polled with it true is a delete."""
    deletes_table: str | None = None
    """PostgreSQL: the table a delete trigger fills with the keys of deleted rows."""


@dataclass(frozen=True, slots=True)
class EmbeddedTargetConfig:
    database: str
    kind: str = "embedded"


@dataclass(frozen=True, slots=True)
class PostgresTargetConfig:
    dsn: str
    password_env: str | None = None
    horizon_margin_seconds: float = 0.2
    """How far the horizon stays below the server's clock: a transaction takes its start
    time a moment before it shows in pg_stat_activity."""
    kind: str = "postgres"


@dataclass(frozen=True, slots=True)
class WatcherConfig:
    """A watcher over one target database."""

    target: EmbeddedTargetConfig | PostgresTargetConfig
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


@dataclass(frozen=True, slots=True)
class Polled:
    """A row a poll found: its commit timestamp (micros), its key as text (the cursor's
    tie-breaker and the event's second sort key), the row, whether it was deleted (then the
    row holds only the key), and how many versions it stands for."""

    micros: int
    key: str
    row: dict[str, Any]
    deleted: bool = False
    versions: int | None = None
    """Versions of the row committed since the previous round's horizon, where the database
    keeps them (the embedded database); None where it cannot tell (PostgreSQL)."""


@dataclass(frozen=True, slots=True)
class Page:
    """What one poll of a table returned: rows in (timestamp, key) order, the table's cursor
    after them, and whether more rows are waiting below the horizon."""

    rows: list[Polled]
    cursor: Any
    full: bool
