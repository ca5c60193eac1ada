"""The apply job: merge pending changes into the baseline in one atomic Delta commit (AP-5,
AP-6). Only the key ranges that pending changes touch are read and rewritten, so the job's
cost follows the changes and the size of the ranges they land in, not the table size.

Crash safety: new files are written under fresh names first; the Delta commit then swaps
them in together with the manifest, the watermark and the set of pending files it applied.
A crash before the commit leaves orphans only; a crash after it but before the pending
cleanup is harmless, because the next job skips pending files the manifest lists as applied.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.transaction import AddAction, CommitProperties, RemoveAction

from cdcflow.clock import Clock
from cdcflow.model.timestamps import to_micros
from cdcflow.table.deletion_vectors import write_vector
from cdcflow.table.delta_log import EXPIRED_LOG_CLEANUP, FileAction, commit, upgrade_actions
from cdcflow.table.layout import (
    MANIFEST,
    FileEntry,
    Manifest,
    conform,
    read_file,
    write_file,
    write_patch,
)
from cdcflow.table.merge import (
    assign_slices,
    key_array,
    key_tuples,
    merge_range,
    split,
    state_schema,
    winners,
)
from cdcflow.table.patching import RangePatch, patch_range, patchable
from cdcflow.table.pending import pending_path, pending_schema
from cdcflow.table.snapshots import newest, newest_manifest

JOB = "cdcflow.job"
CHECKPOINT_INTERVAL = 100


def epoch_seconds(clock: Clock) -> float:
    return to_micros(clock.now()) / 1e6


@dataclass(slots=True)
class ApplyPlan:
    """The ranges an apply would write: file index -> merged (data, state) to rewrite, or
    file index -> a patch (merge_on_read)."""

    manifest: Manifest
    pending_files: list[tuple[str, int]]
    changes: int
    touched: dict[int, tuple[pa.Table, pa.Table]] = field(default_factory=dict)
    patched: dict[int, RangePatch] = field(default_factory=dict)
    applied: int = 0
    merge_on_read: bool = False


def _pending_files(root: Path) -> list[tuple[str, int]]:
    actions = pa.table(newest(pending_path(root)).get_add_actions(flatten=True)).to_pylist()
    return sorted((a["path"], a["size_bytes"]) for a in actions)


class PendingFileCache:
    """Pending files' rows, each file read once per process. A pending file never changes
    once written (a unique name, renamed into place); the fold's lookups read every unapplied
    file of a table on every batch. Bounded by rows; the least recently used go first."""

    def __init__(self, max_rows: int = 1_000_000) -> None:
        self.max_rows = max_rows
        self._tables: OrderedDict[tuple[str, pa.Schema], pa.Table] = OrderedDict()
        self._rows = 0
        self._lock = threading.Lock()

    def rows(self, path: str, target: pa.Schema) -> pa.Table:
        key = (path, target)
        with self._lock:
            if key in self._tables:
                self._tables.move_to_end(key)
                return self._tables[key]
        table = conform(pq.read_table(path), target)
        with self._lock:
            if key not in self._tables and table.num_rows <= self.max_rows:
                self._tables[key] = table
                self._rows += table.num_rows
                while self._rows > self.max_rows:
                    self._rows -= self._tables.popitem(last=False)[1].num_rows
        return table

    def keep_only(self, folder: str, paths: set[str]) -> None:
        """Forget the files of `folder` not in `paths`: once applied, a pending file is
        never read again, so keeping it would only hold memory until the LRU bound."""
        prefix = os.path.join(folder, "")
        with self._lock:
            gone = [key for key in self._tables
                    if key[0].startswith(prefix) and key[0] not in paths]
            for key in gone:
                self._rows -= self._tables.pop(key).num_rows

    def __len__(self) -> int:
        return len(self._tables)


PENDING_FILES = PendingFileCache()


def load_changes(root: Path, files: list[str], schema: pa.Schema) -> pa.Table:
    """The pending rows of `files` as one table in the pending schema."""
    target = pending_schema(schema)
    folder = Path(pending_path(root)).resolve()
    paths = [str(folder / name) for name in files]
    PENDING_FILES.keep_only(str(folder), set(paths))
    tables = [PENDING_FILES.rows(path, target) for path in paths]
    return pa.concat_tables(tables) if tables else target.empty_table()


def plan_apply(root: Path, schema: pa.Schema, primary_key: tuple[str, ...], now_micros: int,
               retention_micros: int, only_keys: pa.Array | None = None,
               merge_on_read: bool = False) -> ApplyPlan:
    """Merge the unapplied pending changes (optionally only those of some keys) into the
    ranges they touch, in memory. With merge_on_read, ranges that take the changes as a
    patch (`patchable`) get one instead of a rewrite."""
    # Pending files first: an apply commits its manifest before it drops the files it
    # applied, so a file missing from this list is in the manifest read after it.
    pending = _pending_files(root)
    manifest = newest_manifest(root)
    unapplied = [p for p, _ in pending if p not in manifest.applied_pending]
    changes = load_changes(root, unapplied, schema)
    if only_keys is not None:
        changes = changes.filter(pc.is_in(key_array(changes, primary_key), value_set=only_keys))
    best = winners(changes, primary_key)
    result = ApplyPlan(manifest, pending, best.num_rows, merge_on_read=merge_on_read)
    slices = assign_slices([f.low for f in manifest.files], key_tuples(best, primary_key))

    def merge_one(index: int) -> tuple[int, RangePatch | tuple[pa.Table, pa.Table, int]]:
        begin, finish = slices[index]
        part = best.slice(begin, finish - begin)
        entry = manifest.files[index] if manifest.files else None
        if merge_on_read and entry is not None and patchable(entry, finish - begin):
            return index, patch_range(root, entry, part, schema, primary_key, now_micros,
                                      retention_micros)
        if entry is not None:
            data, state = read_file(root, entry, schema, primary_key)
        else:
            data, state = schema.empty_table(), state_schema(schema, primary_key).empty_table()
        return index, merge_range(data, state, part, schema, primary_key, now_micros,
                                  retention_micros)

    for index, merged in in_parallel(merge_one, list(slices)):
        if isinstance(merged, RangePatch):
            result.patched[index] = merged
            result.applied += merged.applied
        else:
            result.touched[index] = merged[:2]
            result.applied += merged[2]
    return result


def in_parallel(work: Callable[[Any], Any], items: list[Any]) -> list[Any]:
    """`work` over `items` on a few threads (Arrow and Parquet release the GIL), in order."""
    if len(items) < 2:
        return [work(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(len(items), os.cpu_count() or 1, 4)) as pool:
        return list(pool.map(work, items))


@contextmanager
def apply_lock(root: Path) -> Iterator[None]:
    """One apply job per table at a time, across processes."""
    folder = root / "_cdcflow"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "apply.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def commit_apply(root: Path, plan: ApplyPlan, primary_key: tuple[str, ...], target_rows: int,
                 watermark: int, started: float, clock: Clock) -> dict[str, Any]:
    """Write the touched ranges anew (or their patches) and commit them with the manifest in
    one Delta commit."""
    manifest = plan.manifest
    changed = set(plan.touched) | set(plan.patched)
    entries = [f for i, f in enumerate(manifest.files) if i not in changed]
    removed: list[FileAction] = []
    added: list[FileAction] = []
    pieces = [piece for data, state in plan.touched.values()
              for piece in split(data, state, primary_key, target_rows) if piece[1].num_rows]
    written = in_parallel(lambda piece: write_file(root, piece[0], piece[1], primary_key, clock),
                          pieces)
    written += in_parallel(lambda item: _patched_entry(root, manifest.files[item[0]], item[1],
                                                       clock), list(plan.patched.items()))
    for index in changed:
        if manifest.files:
            removed += file_actions(manifest.files[index])
    for entry in written:
        added += file_actions(entry)
    entries = sorted(entries + written, key=lambda e: e.low)
    stats = {
        "started": started, "ended": epoch_seconds(clock), "changes": plan.changes,
        "applied": plan.applied, "files_rewritten": len(plan.touched),
        "files_patched": len(plan.patched), "rows": sum(e.live_rows for e in entries),
        "watermark": watermark,
    }
    stats["duration_seconds"] = stats["ended"] - started
    new_manifest = Manifest(tuple(entries), frozenset(p for p, _ in plan.pending_files),
                            watermark, manifest.version + 1)
    metadata = {MANIFEST: new_manifest.to_json(), JOB: json.dumps(stats)}
    _commit(root, removed, added, metadata, plan.merge_on_read or bool(plan.patched),
            to_micros(clock.now()) // 1000)
    _drop_applied_pending(root, plan.pending_files, to_micros(clock.now()) // 1000)
    return stats


def file_actions(entry: FileEntry) -> list[FileAction]:
    """The Delta data files of a range: its base (with its vector) and its patch's rows."""
    actions = [FileAction(entry.data, entry.size, entry.rows, entry.vector)]
    if entry.patch is not None and entry.patch.rows:
        actions.append(FileAction(entry.patch.data, entry.patch.size, entry.patch.rows))
    return actions


def _patched_entry(root: Path, old: FileEntry, patch: RangePatch, clock: Clock) -> FileEntry:
    vector = write_vector(root, patch.hidden) if len(patch.hidden) else None
    written = write_patch(root, patch.data, patch.state, clock)
    return replace(old, vector=vector, patch=written)


def _checkpoint(table: DeltaTable) -> None:
    """A checkpoint of the newest version, then, as delta-rs does after its own commits, the
    log entries no checkpoint still needs that are older than the table's
    `delta.logRetentionDuration` (30 days unless set) removed, unless
    `delta.enableExpiredLogCleanup` is false. Without the second, the log of a table with
    deletion vectors, committed by cdcflow, grew by an entry per apply for good."""
    table.create_checkpoint()
    if table.metadata().configuration.get(EXPIRED_LOG_CLEANUP, "true").lower() != "false":
        table.cleanup_metadata()


def _commit(root: Path, removed: list[FileAction], added: list[FileAction],
            metadata: dict[str, str], merge_on_read: bool, now_ms: int) -> None:
    """One Delta commit; written by cdcflow itself when vectors are involved."""
    table = DeltaTable(str(root))
    if merge_on_read or any(a.vector for a in removed + added):
        upgrade = upgrade_actions(table) if any(a.vector for a in added) else []
        actions = upgrade + [a.remove(now_ms) for a in removed] + [a.add(now_ms) for a in added]
        if commit(root, table, actions, metadata, now_ms) % CHECKPOINT_INTERVAL == 0:
            _checkpoint(DeltaTable(str(root)))
        return
    delta_actions: list[AddAction | RemoveAction] = [
        RemoveAction(a.path, True, now_ms, a.size, {}) for a in removed]
    delta_actions += [AddAction(a.path, a.size, {}, now_ms, True,
                                json.dumps({"numRecords": a.rows})) for a in added]
    table.create_write_transaction(
        delta_actions, mode="append", schema=table.schema(),
        commit_properties=CommitProperties(custom_metadata=metadata),
    )


def _drop_applied_pending(root: Path, files: list[tuple[str, int]], now_ms: int) -> None:
    if not files:
        return
    pending = DeltaTable(pending_path(root))
    pending.create_write_transaction(
        [RemoveAction(path, True, now_ms, size, {}) for path, size in files],
        mode="append", schema=pending.schema(),
    )


def load_sorted(root: Path, data: pa.Table, primary_key: tuple[str, ...], target_rows: int,
                watermark: int, started: float, clock: Clock) -> dict[str, Any]:
    """Write `data` as key ranges of `target_rows` with fresh state, in one Delta commit."""
    order = [(k, "ascending") for k in primary_key]
    data = data.sort_by(order)
    rows = data.num_rows
    state_columns = {k: data.column(k) for k in primary_key} | {
        "_seq_key": pa.array([""] * rows, pa.string()),
        "_ingest": pa.array([0] * rows, pa.int64()),
        "_row": pa.array(range(rows), pa.int64()),
        "_deleted_at": pa.nulls(rows, pa.int64()),
    }
    state = pa.Table.from_pydict(state_columns, schema=state_schema(data.schema, primary_key))
    plan = ApplyPlan(newest_manifest(root), [], rows)
    now_ms = to_micros(clock.now()) // 1000
    entries, actions = [], []
    for start in range(0, rows, target_rows):
        entry = write_file(root, data.slice(start, target_rows), state.slice(start, target_rows),
                           primary_key, clock)
        entries.append(entry)
        actions.append(AddAction(entry.data, entry.size, {}, now_ms, True,
                                 json.dumps({"numRecords": entry.rows})))
    stats = {"started": started, "ended": epoch_seconds(clock), "changes": rows, "applied": rows,
             "files_rewritten": 0, "rows": rows, "watermark": watermark, "bulk_load": True}
    stats["duration_seconds"] = stats["ended"] - started
    manifest = Manifest(tuple(entries), plan.manifest.applied_pending, watermark,
                        plan.manifest.version + 1)
    table = DeltaTable(str(root))
    table.create_write_transaction(
        list(actions), mode="append", schema=table.schema(),
        commit_properties=CommitProperties(custom_metadata={
            MANIFEST: manifest.to_json(), JOB: json.dumps(stats)}),
    )
    return stats
