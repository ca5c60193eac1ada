"""Delta tables at their newest version, for reading, without loading each one anew.

A fresh `DeltaTable(path)` reads the last checkpoint and every commit since: 15-25 ms for a
CDC table's pending log, which a running stream commits to on every batch. A stream's
batches and its apply jobs read the same few tables over and over, so `newest` keeps one
handle per table and thread (a handle is not shared between threads) and brings it up to
date with `update_incremental`, which reads only the commits since; when the commit file of
the next version does not exist, and no checkpoint is newer than the handle, the handle is
the newest version already (Delta writes its commits one after another, each as one file),
and nothing more is read.

A handle is used again only while the commit file of the version it holds is the very file
it was (same inode, size and modification time). A table deleted and created again under
the same path has other commit files, and a log cleaned up past that version has none: the
table is then loaded anew. (A filesystem whose modification times are coarse could show a
table deleted and created again within one tick as the same file; cdcflow never does that
to a table it streams into.) Tables that are not local files (an object store URI) are always
loaded anew. Callers read the handle; they never move it to another version or write
through it.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from cdcflow.table.layout import Manifest, read_manifest

HANDLES_PER_THREAD = 64
"""The handles one thread keeps, the least recently used dropped first."""

Stamp = tuple[int, int, int]


class _Cached:
    __slots__ = ("manifest", "stamp", "table")

    def __init__(self, table: DeltaTable, stamp: Stamp) -> None:
        self.table, self.stamp = table, stamp
        self.manifest: Manifest | None = None


_local = threading.local()


def _handles() -> OrderedDict[str, _Cached]:
    handles = getattr(_local, "handles", None)
    if handles is None:
        handles = _local.handles = OrderedDict()
    return handles


def _stamp(path: str, version: int) -> Stamp | None:
    """The identity of the commit file of `version`, or None when there is none here."""
    try:
        found = os.stat(_commit_file(path, version))
    except (OSError, ValueError):
        return None
    return found.st_ino, found.st_size, found.st_mtime_ns


def _commit_file(path: str, version: int) -> str:
    return os.path.join(path, "_delta_log", f"{version:020d}.json")


def _no_commit_since(path: str, version: int) -> bool:
    """Whether `version` is the newest: the next commit file does not exist, and no checkpoint
    after `version` exists either. (A log cleanup deletes the commit files older than the
    newest checkpoint, in no set order, and a killed one stops half-way: the file after an
    old version may be gone while the old version's is not. A cleanup comes after the
    checkpoint it keeps, so `_last_checkpoint` is read after the commit file is looked for.)"""
    if os.path.exists(_commit_file(path, version + 1)):
        return False
    try:
        with open(os.path.join(path, "_delta_log", "_last_checkpoint"), "rb") as handle:
            checkpoint = json.loads(handle.read())["version"]
    except FileNotFoundError:
        return True  # never checkpointed: never cleaned up
    except (OSError, ValueError, KeyError, TypeError):
        return False  # unreadable now: bring it up to date the long way
    return isinstance(checkpoint, int) and checkpoint <= version


def _cached(path: str | Path) -> _Cached:
    """This thread's handle of `path` brought up to date, or the table loaded anew (and
    kept, when it is a local table)."""
    key = str(path)
    handles = _handles()
    cached = handles.get(key)
    if cached is not None and _stamp(key, cached.table.version()) == cached.stamp:
        if _no_commit_since(key, cached.table.version()):
            handles.move_to_end(key)
            return cached
        try:
            cached.table.update_incremental()
        except Exception:  # the commits after it were cleaned up: load it anew below
            cached = None
        else:
            stamp = _stamp(key, cached.table.version())
            if stamp is not None:  # (a kept manifest tells its version: newest_manifest)
                cached.stamp = stamp
                handles.move_to_end(key)
                return cached
    handles.pop(key, None)
    table = DeltaTable(key)
    stamp = _stamp(key, table.version())
    if stamp is None:  # not a local table, or its newest commit already cleaned up
        return _Cached(table, (0, 0, 0))
    handles[key] = cached = _Cached(table, stamp)
    while len(handles) > HANDLES_PER_THREAD:
        handles.popitem(last=False)
    return cached


def newest(path: str | Path) -> DeltaTable:
    """The Delta table at `path` at its newest version, for reading only."""
    return _cached(path).table


def live_paths(path: str | Path) -> list[str]:
    """The data files of the Delta table at `path` at its newest version, relative to it."""
    actions = pa.table(newest(path).get_add_actions(flatten=True))
    return [str(name) for name in actions.column("path").to_pylist()]


def newest_manifest(path: str | Path) -> Manifest:
    """`read_manifest` of the table at its newest version (read once per version: a
    manifest is found among the version's last 50 commits)."""
    cached = _cached(path)
    if cached.manifest is None or cached.manifest.version != cached.table.version():
        cached.manifest = read_manifest(cached.table)
    return cached.manifest


def forget_all() -> None:
    """Drop this thread's handles (tests; a process that deletes tables it read)."""
    _handles().clear()
