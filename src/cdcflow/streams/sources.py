"""From a stream definition's source profile to its `ChangeSource`."""

from __future__ import annotations

from pathlib import Path

from cdcflow.capture.embedded import EmbeddedSource as EmbeddedChangeSource
from cdcflow.capture.mysql.connection import Endpoint
from cdcflow.capture.mysql.source import MySqlConfig
from cdcflow.capture.mysql.source import MySqlSource as MySqlChangeSource
from cdcflow.capture.postgres.source import PostgresConfig
from cdcflow.capture.postgres.source import PostgresSource as PostgresChangeSource
from cdcflow.capture.source import ChangeSource, WorkerHooks
from cdcflow.capture.watcher.config import (
    EmbeddedTargetConfig,
    PostgresTargetConfig,
    WatcherConfig,
)
from cdcflow.capture.watcher.config import WatchedTable as ConfiguredTable
from cdcflow.capture.watcher.source import WatcherSource as WatcherChangeSource
from cdcflow.streams.definition import (
    EmbeddedSource,
    MySqlSource,
    PostgresSource,
    PostgresWatchTarget,
    StreamDefinition,
    WatcherSource,
)


def log_path(definition: StreamDefinition, home: str | Path) -> str:
    """Where an external source's change log lives: `<home>/logs/<stream>.db`."""
    return str(Path(home).resolve() / "logs" / f"{definition.name}.db")


def open_source(definition: StreamDefinition, home: str | Path,
                hooks: WorkerHooks | None = None) -> ChangeSource:
    """The source of a stream; `home` is the catalog's folder; `hooks` connect a capture
    worker to its stream (its errors, requests to backfill a table again)."""
    match definition.source:
        case EmbeddedSource(database=database, change_stream=change_stream):
            return EmbeddedChangeSource(database, change_stream)
        case PostgresSource() as source:
            return PostgresChangeSource(PostgresConfig(
                source.dsn, source.password_env, definition.slot(),
                definition.publication(), log_path(definition, home),
                definition.include, definition.exclude, source.heartbeat_seconds,
                dict(source.primary_keys), dict(source.numeric_precision),
                int(source.retained_wal_warning_mb * 1024 * 1024), source.chunk_rows),
            hooks=hooks)
        case MySqlSource() as source:
            return MySqlChangeSource(MySqlConfig(
                Endpoint(source.host, source.port, source.user, source.password_env),
                source.databases, definition.replica_server_id(),
                log_path(definition, home), definition.include, definition.exclude,
                source.chunk_rows, source.heartbeat_seconds, source.on_position_lost),
                hooks=hooks)
        case WatcherSource() as source:
            return WatcherChangeSource(WatcherConfig(
                watch_target(source), tuple(ConfiguredTable(
                    t.name, t.commit_timestamp_column, t.shard_column, t.shards(),
                    t.soft_delete_column, t.deletes_table)
                    for t in source.tables), log_path(definition, home),
                source.poll_interval_seconds, source.adaptive, source.page_rows), hooks=hooks)
    raise AssertionError(f"unhandled source {definition.source!r}")


def watch_target(source: WatcherSource) -> EmbeddedTargetConfig | PostgresTargetConfig:
    target = source.target
    if isinstance(target, PostgresWatchTarget):
        return PostgresTargetConfig(target.dsn, target.password_env,
                                    target.horizon_margin_seconds)
    return EmbeddedTargetConfig(target.database)


def remove_source(definition: StreamDefinition, home: str | Path) -> None:
    """Drop what a stream's source keeps on its server (a PostgreSQL slot and publication);
    the embedded database keeps nothing for a stream."""
    if isinstance(definition.source, EmbeddedSource):
        return
    source = open_source(definition, home)
    try:
        source.remove()
    finally:
        source.close()
