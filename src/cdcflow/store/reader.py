"""The change-stream query: READ_<stream>(start, end, token, heartbeat) over the log (CS-5..9).

A query on a partition returns its records in (commit_timestamp, record_sequence) order, each
once (CS-3). With end_timestamp NULL it tails: it polls for new commits, and while the partition
is idle it returns heartbeats. A heartbeat at T is safe under concurrent writers: T never
exceeds the snapshot's *safe time*, the larger of the last commit timestamp and the published
`closed_micros`, and every later commit is assigned a timestamp above both (CS-8).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import orjson

from cdcflow.clock import Clock
from cdcflow.errors import InvalidArgument, NotFound, OutOfRange, show
from cdcflow.model.records import (
    ChangeRecord,
    ChildPartition,
    ChildPartitionsRecord,
    DataChangeRecord,
    HeartbeatRecord,
    format_sequence,
)
from cdcflow.model.schema import ChangeStreamDef
from cdcflow.model.timestamps import format_rfc3339, from_micros, to_micros
from cdcflow.model.types import check_text
from cdcflow.store import journal, log, partition_map
from cdcflow.store.session import Session
from cdcflow.store.sqlite import read_transaction

MIN_HEARTBEAT_MS = 1_000
MAX_HEARTBEAT_MS = 300_000
_BATCH = 1_000
_POLL_MIN_S = 0.01
_POLL_MAX_S = 0.2


@dataclass(frozen=True, slots=True)
class QueryArgs:
    """Validated arguments of one change-stream query, in microseconds."""

    stream: ChangeStreamDef
    start_micros: int
    end_micros: int | None
    token: str | None
    heartbeat_ms: int


def validate_query(
    session: Session,
    stream_name: str,
    start_micros: int,
    end_micros: int | None,
    token: str | None,
    heartbeat_ms: int,
    now_micros: int,
) -> QueryArgs:
    """Enforce every CS-5 argument rule; raise a typed error naming the value otherwise."""
    check_text(stream_name, "change stream name")
    if token is not None:
        check_text(token, "partition_token")
    with read_transaction(session.conn):
        stream = session.refresh().stream(stream_name)
        if token is not None:
            partition_map.get_partition(session.conn, stream_name, token)
    if isinstance(heartbeat_ms, bool) or not isinstance(heartbeat_ms, int):
        raise InvalidArgument(f"heartbeat_milliseconds {show(heartbeat_ms)} must be an INT64")
    if not MIN_HEARTBEAT_MS <= heartbeat_ms <= MAX_HEARTBEAT_MS:
        raise InvalidArgument(
            f"heartbeat_milliseconds {show(heartbeat_ms)} is outside "
            f"{MIN_HEARTBEAT_MS}..{MAX_HEARTBEAT_MS}"
        )
    if start_micros > now_micros:
        raise InvalidArgument(
            f"start_timestamp {format_rfc3339(start_micros)} is in the future "
            f"(now is {format_rfc3339(now_micros)})"
        )
    earliest = max(stream.created_micros, now_micros - stream.retention_micros)
    if start_micros < stream.created_micros:
        raise InvalidArgument(
            f"start_timestamp {format_rfc3339(start_micros)} is before the creation of change "
            f"stream {stream_name!r} at {format_rfc3339(stream.created_micros)}"
        )
    if start_micros < earliest:
        raise OutOfRange(
            f"start_timestamp {format_rfc3339(start_micros)} is outside the retention period "
            f"of change stream {stream_name!r}; the earliest valid timestamp is "
            f"{format_rfc3339(earliest)}"
        )
    if end_micros is not None and end_micros < start_micros:
        raise InvalidArgument(
            f"end_timestamp {format_rfc3339(end_micros)} is before start_timestamp "
            f"{format_rfc3339(start_micros)}"
        )
    return QueryArgs(stream, start_micros, end_micros, token, heartbeat_ms)


def initial_partitions(session: Session, args: QueryArgs) -> ChangeRecord:
    """The first query (NULL token): one child-partitions record naming the partitions that
    cover `start`, with empty parent lists (CS-5)."""
    with read_transaction(session.conn):
        partitions = partition_map.all_partitions(session.conn, args.stream.name)
    covering = [
        p for p in partitions
        if to_micros(p.start_timestamp) <= args.start_micros
        and (p.end_timestamp is None or to_micros(p.end_timestamp) > args.start_micros)
    ]
    children = tuple(ChildPartition(p.token, ()) for p in covering)
    record = ChildPartitionsRecord(from_micros(args.start_micros), format_sequence(0), children)
    return ChangeRecord(child_partitions_record=record)


def _child_record(body: str, not_before: int = 0) -> ChangeRecord:
    """The child-partitions record of a log body; its start is at least `not_before` (a query
    of a partition that ended before the query's start gets the query's start, CS-9)."""
    data = json.loads(body)
    children = tuple(ChildPartition(t, tuple(parents)) for t, parents in data["children"])
    start = max(int(data["start_micros"]), not_before)
    record = ChildPartitionsRecord(from_micros(start), format_sequence(0), children)
    return ChangeRecord(child_partitions_record=record)


def read_partition(
    session: Session,
    clock: Clock,
    args: QueryArgs,
    publish_closed: Callable[[int], int],
) -> Iterator[ChangeRecord]:
    """Records of one partition from `start` to `end` (or until the partition ends)."""
    assert args.token is not None
    if args.end_micros is not None and args.end_micros <= to_micros(clock.now()):
        publish_closed(args.end_micros)  # an end in the past: no need to wait for commits
    position = log.after_micros(args.start_micros - 1)
    last_progress = to_micros(clock.now())
    poll = _POLL_MIN_S
    promised = -1
    while True:
        safe, bound, rows, ended_at = _poll(session, args, position)
        if ended_at is None:
            raise NotFound(f"partition {args.token!r} of stream {args.stream.name!r} no longer "
                           "exists")
        for micros, seq, kind, body in rows:
            position = (micros, seq)
            if kind == log.LOG_CHILD:
                yield _child_record(body)
                return
            record = DataChangeRecord.from_dict(orjson.loads(body))
            yield ChangeRecord(data_change_record=record)
        if rows:
            last_progress = to_micros(clock.now())
            poll = _POLL_MIN_S
            if len(rows) == _BATCH:
                continue
        if ended_at[0] is not None and ended_at[0] < args.start_micros:
            yield from _late_children(session, args)
            return
        if args.end_micros is not None and safe >= args.end_micros:
            return
        now = to_micros(clock.now())
        if not rows and now - last_progress >= args.heartbeat_ms * 1_000:
            if promised >= 0 and bound >= promised:
                yield ChangeRecord(heartbeat_record=HeartbeatRecord(from_micros(bound)))
                last_progress, promised = now, -1
                continue
            recent = safe >= now - args.heartbeat_ms * 500
            promised = safe if recent else publish_closed(now)
            continue
        clock.sleep(poll)
        poll = min(poll * 2, _POLL_MAX_S)


def _poll(
    session: Session, args: QueryArgs, position: tuple[int, int]
) -> tuple[int, int, list[log.LogRow], tuple[int | None] | None]:
    """One consistent look at the log: the safe time, the bound of this read (the safe time,
    or the query's end if earlier), the next records up to it, and the partition's end (None
    when the partition is gone)."""
    assert args.token is not None
    journal.settle_pending(session)
    with read_transaction(session.conn):
        safe = journal.safe_micros(session.conn)
        bound = safe if args.end_micros is None else min(safe, args.end_micros)
        rows = log.records_after(session.conn, args.stream.name, args.token, position, bound,
                                 _BATCH)
        found = log.partition(session.conn, args.stream.name, args.token)
    return safe, bound, rows, None if found is None else (found[4],)


def _late_children(session: Session, args: QueryArgs) -> Iterator[ChangeRecord]:
    """Child records of a partition that ended before the query's start."""
    assert args.token is not None
    with read_transaction(session.conn):
        bodies = log.child_bodies(session.conn, args.stream.name, args.token)
    for body in bodies:
        yield _child_record(body, not_before=args.start_micros)


def scan_log(
    session: Session, stream: str, token: str, after_micros: int, until_micros: int
) -> Iterator[tuple[int, int, str, str | None]]:
    """(kind, commit micros, body, column types) of a partition's log entries with
    after < commit <= until, in order: each body as the log keeps it, with the text of its
    column types apart (None: the body is whole; `log.record_parts_after`).

    For bulk readers (the Spark source) that have planned the range against the safe time
    themselves; the caller checks retention. `kind` is LOG_DATA or LOG_CHILD.
    """
    position = log.after_micros(after_micros)
    journal.settle_pending(session, until_micros)
    while True:
        with read_transaction(session.conn):
            bound = journal.read_bound(session.conn, until_micros)
            rows = log.record_parts_after(session.conn, stream, token, position, bound,
                                          _BATCH * 5)
        for micros, seq, kind, body, types in rows:
            position = (micros, seq)
            yield kind, micros, body, types
        if len(rows) < _BATCH * 5:
            return
