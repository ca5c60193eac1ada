"""The polling change watcher as a `ChangeSource` (seed 001, CW-1..7; read method
`watcher-cdc-poll`).

Each round takes the target's horizon first: a time at or before which every commit is
visible and no later commit can still take a timestamp (on the embedded database, its safe
time: timestamps are assigned inside the write lock). Then every table is polled for rows
whose (commit timestamp, key) is after its cursor and whose timestamp is at most the
horizon, page by page in that order, through the (shard, timestamp) index with the shard
values as an IN-list (CW-5). So a transaction that took its timestamp early and committed
late is read in the round whose horizon covers it: nothing is skipped, and the cursor never
moves past a row that could still appear.

The rows of one commit timestamp become one log transaction (source_timestamp = that
timestamp, each row a whole-row UPDATE, since polling cannot tell an insert from an update),
appended with the table cursors and the round's horizon as the source position, so a killed
worker resumes exactly. Several changes of a row between two polls arrive as its last state,
and hard deletes are never seen (see the README).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from cdcflow.capture.source import RowSink, Snapshot, SourceObject, WorkerHooks
from cdcflow.capture.watcher.config import (
    EmbeddedTargetConfig,
    Polled,
    WatchedTable,
    WatcherConfig,
)
from cdcflow.capture.watcher.embedded import EmbeddedTarget
from cdcflow.capture.watcher.postgres import PostgresTarget
from cdcflow.errors import FailedPrecondition, InvalidArgument
from cdcflow.model.changes import SourceChange, SourceTransaction
from cdcflow.model.source import WATCHER, SourceMetadata
from cdcflow.model.timestamps import from_micros, to_micros
from cdcflow.store.changelog import ChangeLog

CHANGE_STREAM = "changes"
MIN_INTERVAL = 0.1


class WatcherSource:
    kind = WATCHER
    has_worker = True

    def __init__(self, config: WatcherConfig, hooks: WorkerHooks | None = None) -> None:
        self.config = config
        self.hooks = hooks or WorkerHooks()
        self.target: EmbeddedTarget | PostgresTarget = EmbeddedTarget(
            config.target.database) if isinstance(config.target, EmbeddedTargetConfig) \
            else PostgresTarget(config.target)
        self.source_id = self.target.source_id
        self._objects: dict[str, SourceObject] | None = None

    def discover(self) -> list[SourceObject]:
        return self.target.objects(self.config.tables)

    def objects(self) -> dict[str, SourceObject]:
        if self._objects is None:
            self._objects = {o.name: o for o in self.discover()}
        return self._objects

    def forget_objects(self) -> None:
        self._objects = None

    def log_location(self) -> tuple[str, str]:
        return self.config.log_path, CHANGE_STREAM

    def snapshot(self, objects: list[SourceObject], resume: dict[str, Any] | None) -> Snapshot:
        """The horizon now (or an earlier attempt's), pinned in the database until
        `release`; every table's cursor starts there."""
        if not objects:
            raise InvalidArgument("the watcher watches no table; list them under tables")
        log = ChangeLog.open(self.config.log_path)
        log.ensure_change_stream(CHANGE_STREAM)
        if resume is not None:
            when = int(resume["horizon"])
            self.target.pin(self.source_id, when)
            return Snapshot(from_micros(when), resume, from_micros(int(resume["cdc_start"])))
        when = self.target.horizon()
        self.target.pin(self.source_id, when)
        position = {"horizon": when, "cursors": {t.name: self.target.start_cursor(when)
                                                 for t in self.config.tables}}
        start = to_micros(log.current_timestamp()) + 1
        log.forget_position(self.source_id)
        log.advance(self.source_id, None, position)
        return Snapshot(from_micros(when), position | {"cdc_start": start}, from_micros(start))

    def backfill(self, snapshot: Snapshot, objects: list[SourceObject], sink: RowSink,
                 resume: dict[str, Any] | None = None) -> None:
        """The rows as of the snapshot's horizon, in key order; a resume token is a key."""
        when = to_micros(snapshot.read_timestamp)
        for item in objects:
            after = (resume or {}).get(item.name)
            if after == "done":
                continue
            for rows, token in self.target.backfill_chunks(item, when, after,
                                                           self.config.chunk_rows):
                sink(item, rows, token)

    def release(self, snapshot: Snapshot | None) -> None:
        self.target.release(self.source_id)

    def capture(self, log: ChangeLog, stop: threading.Event) -> None:
        stored = log.position(self.source_id)
        if stored is None:
            raise FailedPrecondition(f"no watcher position is stored for {self.source_id}; "
                                     "a backfill sets it")
        self.objects()  # checks the tables, and tells the target their columns
        Poller(self, log, stored.position).run(stop)

    def mark(self) -> dict[str, Any]:
        return {"horizon": self.target.horizon()}

    def reached(self, log: ChangeLog, mark: dict[str, Any]) -> bool:
        stored = log.position(self.source_id)
        return stored is not None and int(stored.position["horizon"]) >= int(mark["horizon"])

    def status(self) -> dict[str, Any]:
        return {}

    def remove(self) -> None:
        """A watcher keeps nothing in the database."""

    def close(self) -> None:
        self.target.close()


class Poller:
    """The capture loop: rounds of polls until `stop` is set."""

    def __init__(self, source: WatcherSource, log: ChangeLog, position: dict[str, Any]) -> None:
        self.source, self.log, self.position = source, log, position
        self.config = source.config
        self.interval = MIN_INTERVAL

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            found, full = self.round()
            if not self.config.adaptive:
                stop.wait(self.config.poll_interval_seconds)
            elif not full:
                self.interval = MIN_INTERVAL if found else min(
                    self.interval * 2, self.config.poll_interval_seconds)
                stop.wait(self.interval)

    def round(self) -> tuple[int, bool]:
        """Poll every table up to a new horizon; return the rows found and whether a page
        came back full (more are waiting)."""
        horizon = self.source.target.horizon()
        cursors = dict(self.position["cursors"])
        found, full = 0, False
        for table in self.config.tables:
            page = self.source.target.poll(table, cursors[table.name], horizon,
                                           self.config.page_rows,
                                           since=int(self.position["horizon"]))
            cursors[table.name] = page.cursor
            if page.rows:
                self._append(table, page.rows, cursors)
                found += len(page.rows)
            full = full or page.full
        if not full and horizon > int(self.position["horizon"]):
            self._save({"horizon": horizon, "cursors": cursors}, ())
        return found, full

    def _append(self, table: WatchedTable, rows: list[Polled],
                cursors: dict[str, Any]) -> None:
        """A page's rows, with the cursors after it; the horizon moves only once a round
        has drained every table (see `round`)."""
        item = self.source.objects()[table.name]
        if set(rows[-1].row) - {c.name for c in item.columns}:  # a column was added
            self.source.forget_objects()
            item = self.source.objects()[table.name]
        encode = self.source.target.encode
        self._save({"horizon": self.position["horizon"], "cursors": dict(cursors)},
                   transactions(item, table, [(p, encode(item, p.row)) for p in rows],
                                self.source.source_id))

    def _save(self, position: dict[str, Any], batch: Iterable[SourceTransaction]) -> None:
        batch = list(batch)
        if batch:
            self.log.append_many(self.source.source_id, batch, self.position, position)
        else:
            self.log.advance(self.source.source_id, self.position, position)
        self.position = position


def transactions(item: SourceObject, table: WatchedTable, rows: list[tuple[Polled, dict[str, Any]]],
                 target: str) -> list[SourceTransaction]:
    """One transaction per commit timestamp, in poll order: whole rows as UPDATEs, and
    DELETEs for deleted rows and rows whose soft-delete column is true."""
    keys, types = set(item.primary_key), item.column_types()
    grouped: dict[int, list[SourceChange]] = {}
    for polled, row in rows:
        deleted = polled.deleted or (table.soft_delete_column is not None and
                                     row.get(table.soft_delete_column) is True)
        grouped.setdefault(polled.micros, []).append(SourceChange(
            item.name, "DELETE" if deleted else "UPDATE",
            {k: v for k, v in row.items() if k in keys},
            {} if deleted else {k: v for k, v in row.items() if k not in keys}, {}, types,
            "NEW_ROW", {"commit_timestamp": polled.micros, "key": polled.key} | (
                {} if polled.versions is None else {"versions_seen": polled.versions})))
    return [SourceTransaction(SourceMetadata(WATCHER.cdc_method, from_micros(micros),
                                             str(micros), {"target": target}), tuple(changes))
            for micros, changes in grouped.items()]
