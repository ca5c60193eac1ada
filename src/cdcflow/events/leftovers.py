"""What earlier attempts at an event batch left beside its files, removed once it commits.

A batch counts as written when its manifest is; attempts before the one that committed may
have left files that the manifest does not list:
- the aside file of a write killed before its move (`.<name>.<random>.tmp`), which no one
  would ever remove;
- the files of an attempt that cut the batch otherwise (`batch-<id>-keyed2-...` where the
  batch committed as `keyed3`), whose events a reader that lists the folders instead of
  reading the manifests would count twice.

They sit in the folders of the files the manifest lists: every attempt at a batch reads the
same events and groups them by the same object and minute. Once the manifest is written, a
writer still at work on the batch is one its killed driver left running, so its files and
aside files can go too (a write whose aside file goes fails, and writes nothing).

The sweep is a best effort after the commit: a file it cannot remove stays, and it never
fails the batch. A file that is one the manifest lists, by its identity on the disk and not
only by its path (a folder reached under two spellings, on a filesystem that folds case), is
never removed.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterable
from pathlib import Path

_ASIDE = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{32}\.tmp")
"""An `aside_name`."""


def aside_name(name: str) -> str:
    """The name a write puts its file under before moving it to `name`: of its own, so that
    two writers of one file each move a whole file."""
    return f".{name}.{uuid.uuid4().hex}.tmp"


def batch_file_name(key: str) -> re.Pattern[str]:
    """The names of the files of the batch `key`: a streaming batch's key is twelve digits
    or more, then its cut (`batch-000000000007-keyed3-p00001-0000.jsonl`); any other key (a
    backfill chunk's, which may hold dashes) is followed by the part at once, so no other
    key's files match."""
    cut = r"(?:[A-Za-z0-9]+-)?" if re.fullmatch(r"\d{12,}", key) else ""
    return re.compile(rf"batch-{re.escape(key)}-{cut}p\d{{5,}}-\d{{4,}}\.(?:jsonl|avro)")


def written_name(file_name: str) -> str:
    """The name a file is or will be under: an aside file's target, or the name itself."""
    aside = _ASIDE.fullmatch(file_name)
    return file_name if aside is None else aside["name"]


def remove_leftovers(base: Path, key: str, listed: Iterable[str]) -> list[Path]:
    """Delete every file of the batch `key`, and every aside file of one, that sits in a
    folder of the `listed` files (paths under `base`) and is not one of them; return what
    was deleted. Best effort: what it cannot read or remove stays."""
    paths = [base / path for path in listed]
    kept = {_identity(path) for path in paths} - {None}
    found = [path for folder in sorted({str(path.parent) for path in paths})
             for path in _of_batch(folder, key) if _identity(path) not in kept]
    return _unlinked(found)


_MANIFEST = re.compile(r"batch-.+\.json")
"""The name of a batch manifest (`EventFileWriter.manifest_path`)."""


def remove_unfinished_manifests(folder: Path) -> list[Path]:
    """Delete the aside files of batch manifests in `folder`, the stream's `_manifests`: a
    driver killed while it committed a batch left them, and that batch is not committed (a
    replay writes its manifest anew). Return what was deleted. Best effort, as
    `remove_leftovers`. Call it while nothing commits to the folder, as a query starts; a
    commit it meets anyway fails to move its manifest, and its batch is replayed."""
    try:
        with os.scandir(folder) as entries:
            found = [Path(e.path) for e in entries
                     if (aside := _ASIDE.fullmatch(e.name)) and _MANIFEST.fullmatch(aside["name"])
                     and e.is_file(follow_symlinks=False)]
    except OSError:
        return []
    return _unlinked(sorted(found))


def _unlinked(paths: Iterable[Path]) -> list[Path]:
    """Delete the files; those deleted. One gone meanwhile, or not ours to remove, stays."""
    removed = []
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            continue
        removed.append(path)
    return removed


def _of_batch(folder: str, key: str) -> list[Path]:
    """The files of the batch `key` in `folder`, and aside files of such files. A folder
    holds the files of every batch of its minute: a name is matched in full only once it
    begins like one of the batch's."""
    prefix = f"batch-{key}-"
    exact = batch_file_name(key)
    try:
        with os.scandir(folder) as entries:
            return [Path(e.path) for e in entries
                    if e.name.startswith((prefix, "." + prefix))
                    and exact.fullmatch(written_name(e.name))
                    and e.is_file(follow_symlinks=False)]
    except OSError:
        return []


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        found = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return found.st_dev, found.st_ino
