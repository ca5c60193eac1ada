"""Reclaiming a CDC table's storage: deleting the files that no version still in use names.

An apply writes the ranges it touches under new names, and one Delta commit swaps them in; the
files they replace stay on disk, and so do the pending files it applied. So do the files of an
apply, or of a batch, killed before its commit, and the write-aside files of killed writers.
Without a vacuum a streamed table's folder grows with every apply: a range is rewritten every
few seconds.

`vacuum` deletes a file of the table's folders (`data/`, `_cdcflow/state/`, `dv/`, the pending
table's folder, and write-aside files in the Delta logs) when all of these hold:
- no manifest that was current at any time within the retention names it: a data, state,
  deletion-vector or patch file of a range; nor, for a pending file, lists it as applied in a
  commit within the retention (it was dropped from the pending table just after);
- the newest versions of the table and of its pending table do not list it;
- it was last modified before the retention began (a file written for a commit still to come).

A reader holds a version for as long as it reads, so the retention must be longer than the
longest read, and than the longest time a batch takes from writing its pending files to
committing them: at least `MIN_RETENTION` unless the caller says otherwise (a batch whose files
are gone by its commit is refused and run again: `pending.commit_pending_files`). A vacuum
takes no lock: a file written after it began is newer than its cutoff, and a file an apply
replaces or drops while it runs was named by the versions it read (the live files are
read before the manifests: an apply lists the pending files it drops in its manifest
first). Killed, it has deleted
only files nothing uses, and the next one deletes the rest.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from cdcflow.clock import Clock
from cdcflow.errors import DataLoss, FailedPrecondition, InvalidArgument
from cdcflow.model.timestamps import to_micros
from cdcflow.table.apply import JOB
from cdcflow.table.layout import MANIFEST, FileEntry
from cdcflow.table.metadata import MIN_FILE_RETENTION_SECONDS
from cdcflow.table.pending import pending_path
from cdcflow.table.snapshots import live_paths, newest

MIN_RETENTION = timedelta(seconds=MIN_FILE_RETENTION_SECONDS)
COMMIT_SLACK_MS = 60_000
"""A manifest's commit time is its job's end, taken just before the commit: it counts as
superseded this much later (a tenth of a shorter retention), for the time the commit itself
takes and for clocks that differ."""
HISTORY_PAGE = 100
"""Commits read at first when looking back over the retention (more if it needs more)."""


@dataclass(frozen=True, slots=True)
class Vacuumed:
    """What a vacuum deleted: the files (relative to the table's root) and their bytes."""

    files: tuple[str, ...]
    bytes: int


def vacuum(root: Path, retention: timedelta, clock: Clock,
           enforce_retention: bool = True) -> Vacuumed:
    """Delete the files of the table at `root` that no version in use within `retention`
    names (see the module's docstring)."""
    if enforce_retention and retention < MIN_RETENTION:
        raise InvalidArgument(
            f"file retention {retention} is shorter than {MIN_RETENTION}: a read or a batch "
            "that takes longer could lose its files (enforce_retention=False to allow it)")
    if retention < timedelta(0):
        raise InvalidArgument(f"file retention {retention} must not be negative")
    retention_ms = int(retention.total_seconds() * 1000)
    cutoff_ms = to_micros(clock.now()) // 1000 - retention_ms
    kept = _in_use(root, cutoff_ms - min(COMMIT_SLACK_MS, retention_ms // 10))
    deleted, size = [], 0
    for path in _candidates(root):
        name = path.relative_to(root).as_posix()
        try:
            found = path.stat()
        except FileNotFoundError:
            continue
        if name in kept or found.st_mtime_ns // 1_000_000 >= cutoff_ms:
            continue
        path.unlink(missing_ok=True)
        deleted.append(name)
        size += found.st_size
    return Vacuumed(tuple(sorted(deleted)), size)


def _in_use(root: Path, cutoff_ms: int) -> set[str]:
    """The files, relative to `root`, that the versions in use since `cutoff_ms` name. A
    pending file an apply lists as applied was dropped from the pending table just after
    that apply's commit: it is in use only when that commit is after the cutoff."""
    pending = Path(pending_path(root)).relative_to(root).as_posix()
    # the live files first: an apply that commits meanwhile lists what it drops as applied
    kept = {f"{pending}/{name}" for name in live_paths(pending_path(root))}
    kept.update(live_paths(root))
    for manifest, committed_ms in _manifests_in_use(root, cutoff_ms):
        for entry in manifest["files"]:
            kept.update(_files_of(root, FileEntry.from_json(entry)))
        if committed_ms > cutoff_ms:
            kept.update(f"{pending}/{name}" for name in manifest["applied_pending"])
    return kept


def _manifests_in_use(root: Path, cutoff_ms: int) -> Iterator[tuple[dict[str, Any], int]]:
    """The manifests current at any time since `cutoff_ms`, with their commit times: the
    newest ones back to the first committed at or before it (current at the cutoff). A log
    cleaned up past that point cannot tell which files the older ones named:
    FailedPrecondition."""
    limit, older_than = HISTORY_PAGE, None
    while True:
        history = newest(root).history(limit)
        for commit in history:  # newest first
            version = int(commit.get("version", 0))
            if older_than is not None and version >= older_than:
                continue  # read in the page before
            older_than = version
            if not commit.get(MANIFEST):
                continue
            manifest, committed_ms = _manifest_of(root, commit)
            yield manifest, committed_ms
            if committed_ms <= cutoff_ms:
                return
        if len(history) < limit:  # the whole history read
            if history and int(history[-1].get("version", 0)) > 0:
                raise FailedPrecondition(
                    f"the Delta log of {root} begins at version {history[-1]['version']}, "
                    "after the file retention began: it no longer tells which files the "
                    "versions in use named; nothing was deleted")
            return
        limit *= 4


def _manifest_of(root: Path, commit: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """A commit's manifest, and when it was made by the clock of the job that made it (the
    job's end); by Delta's commit time for a commit without one."""
    try:
        manifest: dict[str, Any] = json.loads(commit[MANIFEST])
        job = json.loads(commit.get(JOB) or "{}")
        committed = job["ended"] * 1000 if "ended" in job else commit["timestamp"]
        return manifest, int(committed)
    except (KeyError, TypeError, ValueError) as error:
        raise DataLoss(f"the manifest of version {commit.get('version')} of {root} is "
                       f"damaged ({type(error).__name__}: {error}); nothing was deleted"
                       ) from None


def _files_of(root: Path, entry: FileEntry) -> Iterator[str]:
    yield entry.data
    yield entry.state
    if entry.vector is not None:
        yield entry.vector.file(root).relative_to(root).as_posix()
    if entry.patch is not None:
        if entry.patch.data:
            yield entry.patch.data
        yield entry.patch.state


def _candidates(root: Path) -> Iterator[Path]:
    """Every file a vacuum may delete: the files of the data, state and deletion-vector
    folders, the pending table's data files and write-aside files, and write-aside files in
    the two Delta logs. (Delta logs, options and locks are never candidates.)"""
    pending = Path(pending_path(root))
    for folder in (root / "data", root / "_cdcflow" / "state", root / "dv", pending):
        for path in _files_in(folder):
            if folder != pending or path.suffix == ".parquet" or _aside(path):
                yield path
    for log in (root / "_delta_log", pending / "_delta_log"):
        yield from (path for path in _files_in(log) if _aside(path))


def _files_in(folder: Path) -> Iterator[Path]:
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return
    yield from (Path(e.path) for e in entries if e.is_file(follow_symlinks=False))


def _aside(path: Path) -> bool:
    """A file cdcflow writes aside to rename into place (`.<name>.tmp`, `.<uuid>.json.tmp`)."""
    return path.name.startswith(".") and path.name.endswith(".tmp")
