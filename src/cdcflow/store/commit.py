"""Commit: apply buffered mutations and write their change records in ONE SQLite
transaction (CS-1). Either the data and its records both exist, or neither does. A native
commit's records are written as its journal row (`cdcflow.store.journal`), rendered into the
log before anything reads or reshapes it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator
from typing import Any

from cdcflow.model.partitions import PartitionMetadata, PartitionPolicy
from cdcflow.model.schema import TableSchema, key_hash
from cdcflow.model.timestamps import format_rfc3339, from_micros
from cdcflow.model.types import COMMIT_TIMESTAMP
from cdcflow.store import journal, log, partition_map, retention
from cdcflow.store.capture import LogEntry, RowChange, encode_record
from cdcflow.store.catalog import (
    Catalog,
    commit_micros_after,
    maintain_indexes,
    next_commit_micros,
)
from cdcflow.store.mutations import Mutation, apply_mutation, table_shape, validate_mutation
from cdcflow.store.rows import VersionRow, latest_versions, version_row, write_versions
from cdcflow.store.session import Session
from cdcflow.store.sqlite import write_meta, write_transaction

GC_INTERVAL_MICROS = 10 * 1_000_000


def commit_mutations(session: Session, mutations: list[Mutation], now_micros: int) -> int:
    """Apply `mutations` atomically; return the commit timestamp in microseconds."""
    conn = session.conn
    with write_transaction(conn):
        catalog = session.refresh()
        micros, transaction_id = allocate_commit(session, now_micros)
        changes = _net_changes(session, catalog, mutations, micros)
        after_texts = _write_versions(session, catalog, changes, micros)
        if catalog.indexes:
            maintain_indexes(session.conn, catalog, ((c.schema, c.encoded_key, c.after)
                                                     for c in changes))
        streams = {s.name for table in {c.schema.name for c in changes}
                   for s in catalog.streams_watching(table)}
        if streams:  # the journal row records the commit's timestamp and transaction id
            journal.write_entry(session.conn, micros, transaction_id, changes, after_texts)
            _after_append(session, catalog, streams, micros)
        else:
            write_meta(session.conn, {"last_commit_micros": micros,
                                      "txn_counter": int(transaction_id)})
            _collect_garbage(session, catalog, micros)
    return micros


def allocate_commit(session: Session, now_micros: int) -> tuple[int, str]:
    """One commit's timestamp and server_transaction_id (CS-7), from the meta that `refresh`
    read under this write lock. The caller records them: in its journal row, or in meta."""
    meta = session.meta
    micros = commit_micros_after(meta, now_micros)
    transaction = int(meta["txn_counter"]) + 1
    meta.update({"last_commit_micros": micros, "txn_counter": transaction})
    return micros, str(transaction)


def _write_versions(session: Session, catalog: Catalog, changes: list[RowChange],
                    micros: int) -> list[str | None]:
    """A version per changed row, one bulk insert per table; return each change's stored
    row text (None: deleted), in order."""
    by_storage: dict[str, list[VersionRow]] = {}
    texts: list[str | None] = []
    for change in changes:
        version = version_row(change.encoded_key, micros, change.key_hash, change.after)
        by_storage.setdefault(catalog.storage(change.schema.name), []).append(version)
        texts.append(version[4])
    for storage, rows in by_storage.items():
        write_versions(session.conn, storage, rows)
    return texts


def next_transaction_id(session: Session) -> str:
    """A server_transaction_id unique in the file (CS-7), under the write lock."""
    return str(next_transaction_ids(session, 1))


def next_transaction_ids(session: Session, count: int) -> int:
    """Allocate `count` consecutive server_transaction_ids under the write lock; return the
    first."""
    first = int(session.meta["txn_counter"]) + 1
    last = first + count - 1
    write_meta(session.conn, {"txn_counter": last})
    session.meta["txn_counter"] = last
    return first


def append_entries(session: Session, catalog: Catalog, entries: Iterable[LogEntry],
                   micros: int) -> None:
    """Append one transaction's records at `micros` (streamed into the log), then split,
    merge and expire per the policy, all inside the caller's write transaction."""
    append_rows(session, catalog, (log.DataRow(e.stream, e.token, micros, e.sequence,
                                               len(e.record.mods), encode_record(e.record))
                                   for e in entries), micros)


def append_rows(session: Session, catalog: Catalog, rows: Iterable[log.DataRow],
                last_micros: int) -> None:
    """Insert encoded records (streamed into the log), then split, merge and expire once for
    the streams they belong to; the last commit is at `last_micros`."""
    streams: set[str] = set()

    def noted() -> Iterator[log.DataRow]:
        for row in rows:
            streams.add(row.stream)
            yield row

    log.insert_data_records(session.conn, noted())
    _after_append(session, catalog, streams, last_micros)


def _after_append(session: Session, catalog: Catalog, streams: set[str], micros: int) -> None:
    policy = _policy(session.meta["partition_policy"])
    for name in streams:
        apply_policy(session, name, policy, micros)
    _collect_garbage(session, catalog, micros)


def _collect_garbage(session: Session, catalog: Catalog, micros: int) -> None:
    """At most every GC_INTERVAL_MICROS, by any commit: expire change records and row
    versions past their retentions (settling the journal first when they would meet it)."""
    if micros - int(session.meta["gc_micros"]) >= GC_INTERVAL_MICROS:
        oldest = journal.first_pending(session.conn)
        if oldest is not None and (any(oldest < micros - s.retention_micros
                                       for s in catalog.streams.values())
                                   or journal.holds_more_than(session.conn,
                                                              journal.SETTLE_BACKLOG)):
            journal.settle(session, catalog)  # retention would meet it, or no reader came
        retention.expire_change_records(session.conn, catalog, micros)
        retention.collect_row_versions(session.conn, catalog, micros)
        write_meta(session.conn, {"gc_micros": micros})


def _net_changes(
    session: Session, catalog: Catalog, mutations: list[Mutation], micros: int
) -> list[RowChange]:
    """One RowChange per touched row, in order of first touch, with the net before/after."""
    commit_text = format_rfc3339(micros)
    checked = [_checked(catalog, raw, micros) for raw in mutations]
    current = _current_rows(session, catalog, checked)
    changes: dict[tuple[str, str], RowChange] = {}
    for schema, mutation, encoded_key in checked:
        change = changes.get((schema.name, encoded_key))
        if change is None:
            before = current[(schema.name, encoded_key)]
            change = RowChange(
                schema, encoded_key, key_hash(schema.name, encoded_key), before, before
            )
            changes[(schema.name, encoded_key)] = change
        change.after = apply_mutation(schema, mutation, change.after, commit_text)
        if mutation.kind == "replace":
            change.written |= table_shape(schema).non_key
        elif mutation.kind != "delete":
            shape = table_shape(schema)
            change.written.update(name for name in mutation.values if name not in shape.key)
            if shape.generated and change.after is not None:  # a computed value that moved
                change.written.update(c.name for c, _ in shape.generated if change.before is None
                                      or change.before.get(c.name) != change.after.get(c.name))
    return [c for c in changes.values() if not (c.before is None and c.after is None)]


CheckedMutation = tuple[TableSchema, Mutation, str]
"""A mutation valid for its table's schema at commit, with its encoded primary key."""


def _checked(catalog: Catalog, raw: Mutation, micros: int) -> CheckedMutation:
    """Validate again only if the table's schema changed since the mutation was buffered. A
    key column given COMMIT_TIMESTAMP takes the commit timestamp, as its row value does."""
    schema = catalog.table(raw.table)
    mutation = raw if raw.checked_against is schema else validate_mutation(schema, raw)
    key = schema.key_of(mutation.values)
    if any(value is COMMIT_TIMESTAMP for value in key):
        key = tuple(from_micros(micros) if v is COMMIT_TIMESTAMP else v for v in key)
    return schema, mutation, schema.encode_key(key)


def _current_rows(session: Session, catalog: Catalog, checked: list[CheckedMutation]
                  ) -> dict[tuple[str, str], dict[str, Any] | None]:
    """The newest version of every touched row, read per table in bulk."""
    keys: dict[str, dict[str, None]] = {}
    for schema, _, encoded_key in checked:
        keys.setdefault(schema.name, {})[encoded_key] = None
    current: dict[tuple[str, str], dict[str, Any] | None] = {}
    for table, table_keys in keys.items():
        found = latest_versions(session.conn, catalog.storage(table), list(table_keys))
        current.update(((table, key), row) for key, row in found.items())
    return current


@functools.lru_cache(maxsize=16)
def _policy(text: str) -> PartitionPolicy:
    return PartitionPolicy.from_json(json.loads(text))


def apply_policy(session: Session, stream: str, policy: PartitionPolicy, micros: int) -> None:
    """Split and merge per the policy, at most once per check interval per stream."""
    if not policy.auto:
        return
    conn = session.conn
    interval = policy.check_interval_seconds * 1_000_000
    if micros - session.policy_checked.get(stream, 0) < interval:
        return
    (checked,) = conn.execute(
        "SELECT policy_checked_micros FROM _streams WHERE name = ?", (stream,)
    ).fetchone()
    session.policy_checked[stream] = int(checked)
    if micros - int(checked) < interval:
        return
    session.policy_checked[stream] = micros
    active = _counted_partitions(session, stream, policy, micros)
    changed = False
    for candidate in partition_map.split_candidates(active, policy):
        partition_map.split(conn, stream, candidate.token, None, next_commit_micros(conn, micros))
        changed = True
    if not changed:
        pair = partition_map.merge_candidate(active, policy, micros)
        if pair is not None:
            at = next_commit_micros(conn, micros)
            partition_map.merge(conn, stream, [pair[0].token, pair[1].token], at)
            changed = True
    conn.execute("UPDATE _streams SET policy_checked_micros = ? WHERE name = ?", (micros, stream))
    if changed:
        session.ranges.pop(stream, None)


def _counted_partitions(session: Session, stream: str, policy: PartitionPolicy, micros: int
                        ) -> list[PartitionMetadata]:
    """The stream's active partitions with their record counts (kept by every insert and
    expiry: `log.count_records`). The journal's commits are counted once it is settled,
    which happens here when the policy might split or merge with them counted (a partition
    map changes only over a settled journal), or once the journal holds over
    `journal.SETTLE_BACKLOG` commits (when no reader settles it)."""
    conn = session.conn
    active = partition_map.active_partitions(conn, stream)
    if journal.first_pending(conn) is None:
        return active
    largest = max((p.record_count for p in active), default=0)
    might_split = largest + journal.pending_changes(conn) >= policy.split_records
    might_merge = partition_map.merge_candidate(active, policy, micros) is not None
    if not (might_split or might_merge
            or journal.holds_more_than(conn, journal.SETTLE_BACKLOG)):
        return active
    journal.settle(session, session.catalog)
    return partition_map.active_partitions(conn, stream)

