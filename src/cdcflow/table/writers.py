"""One writer per CDC table.

A claim in the table's folder (`_cdcflow/writer.json`) says which stream (or change stream)
applies into it and for which object, from the first time that writer opens it. A second
writer, another stream given the same warehouse and an object of the same name, is refused:
two writers' changes, each ordered by its own source, would overwrite each other's rows in
one table. The claim lives in the folder, so it holds across processes and restarts; on a
filesystem that folds case it catches a second spelling of a name whose table it holds.

A claim is made whole or not at all: written aside, synced, then linked to its name, which
fails if the name exists, so that of writers claiming at once exactly one wins. Where the
filesystem has no hard links, an exclusive create and one write take the link's place; a
reader that finds that file still empty is told to try again (Unavailable). Claims are made
under a lock on the claim's folder, so that a claim an earlier cdcflow made by a stream's name
alone is taken over (replaced by its catalog-qualified id) by one writer. `claim_tables`
claims a caller's tables in name order before any is created, and gives back the claims it
made if one is refused, so two streams starting at once cannot each take part of the other's.
Two objects whose folders are one folder (on a filesystem that folds case) meet the first
one's claim, so the second is refused before either table is made.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cdcflow.errors import CdcflowError, FailedPrecondition, Unavailable

WRITER_FILE = "writer.json"
"""In a table's `_cdcflow` folder: {"writer", "what", "object"} of the one that applies."""


@dataclass(frozen=True, slots=True)
class TableWriter:
    """Who applies into tables: `writer` identifies it (a stream by name and catalog),
    `what` names it for people ("stream 'lake'"); `remedy` says how its user gives it a
    table of its own."""

    writer: str
    what: str
    remedy: str
    legacy: str | None = None
    """The id an earlier cdcflow recorded for this writer (a stream's, by its name alone):
    such a claim is this writer's, and its first claim records it under `writer` instead."""

    def check(self, root: Path, name: str) -> dict[str, str] | None:
        """FailedPrecondition if the table at `root` (if any) is another writer's, or this
        writer's for another object than `name`; else its claim (None: unclaimed)."""
        held = _claim_of(root)
        if held is None:
            return None
        file = os.path.abspath(_path(root))
        if not self._owns(held):
            ids = f" ({self.writer} and {held['writer']})" if held["what"] == self.what else ""
            raise FailedPrecondition(
                f"{self.what} would apply {name!r} into the CDC table '{os.path.abspath(root)}', "
                f"which {held['what']} applies {held['object']!r} into{ids}: two writers, each "
                f"in the order of its own source, would overwrite each other's rows; "
                f"{self.remedy}. If {held['what']} is gone for good, remove '{file}' and this "
                "one takes the table over")
        if held["object"] != name:
            raise FailedPrecondition(
                f"objects {held['object']!r} and {name!r} would share one CDC table: "
                f"'{os.path.abspath(root)}' is the folder of {held['object']!r} (a filesystem that "
                "does not tell letter case apart sees one name); leave one of them out or keep "
                f"the tables on a filesystem that tells case apart. If {held['object']!r} is "
                f"gone from the source for good, remove '{file}' and {name!r} takes it over")
        return held

    def claim(self, root: Path, name: str) -> bool:
        """Make this writer the one of the table at `root` (the folder made if missing) for
        object `name`, unless one is; then `check` what is recorded. True if this call
        made the claim."""
        path = _path(root)
        path.parent.mkdir(parents=True, exist_ok=True)
        made = False
        claim = json.dumps({"writer": self.writer, "what": self.what, "object": name}).encode()
        with _locked(path.parent):  # a legacy claim's take-over is one writer's at a time
            if not path.exists():
                made = _create_once(path, claim)
            held = self.check(root, name)
            if held is not None and self.legacy is not None and held["writer"] == self.legacy:
                replace_synced(path, claim)  # from now on, only this writer's id
                self.check(root, name)
        return made

    def holds(self, root: Path) -> bool:
        """Whether the table at `root` is this writer's (or unclaimed)."""
        held = _claim_of(root)
        return held is None or self._owns(held)

    def _owns(self, held: dict[str, str]) -> bool:
        return held["writer"] in (self.writer, self.legacy)


def claim_tables(writer: TableWriter, roots: dict[str, Path]) -> None:
    """Claim the tables of every object (name -> table folder) in name order (letter case
    folded, as some filesystems fold it); if one is refused, or anything fails, give back
    the claims this call made (and the empty folders made for them) and raise."""
    made: list[tuple[Path, str, list[Path]]] = []
    try:
        for name in sorted(roots, key=lambda n: (n.casefold(), n)):
            root = roots[name]
            new_folders = [f for f in (root, root / "_cdcflow") if not f.exists()]
            if writer.claim(root, name):
                made.append((root, name, new_folders))
    except BaseException:
        for root, name, new_folders in made:
            _give_back(writer, root, name, new_folders)
        raise


def _give_back(writer: TableWriter, root: Path, name: str, new_folders: list[Path]) -> None:
    """Remove this writer's claim of `root` for `name` (if it is still the one there) and
    the folders made for it, each only while it is empty."""
    try:
        held = _claim_of(root)
    except CdcflowError:
        return
    if held is None or (held["writer"], held["object"]) != (writer.writer, name):
        return
    _path(root).unlink(missing_ok=True)
    for folder in reversed(new_folders):
        try:
            folder.rmdir()
        except OSError:
            break


def _create_once(path: Path, data: bytes) -> bool:
    """`data` at `path` unless something is there: True if this call put it there."""
    aside = path.with_name(f".{WRITER_FILE}.{secrets.token_hex(8)}.tmp")
    try:
        _write_synced(aside, data)
        try:
            os.link(aside, path)
        except FileExistsError:
            return False
        except OSError:  # no hard links here: an exclusive create in one write
            return _create_exclusive(path, data)
    finally:
        aside.unlink(missing_ok=True)
    _sync_folder(path.parent)
    return True


def replace_synced(path: Path, data: bytes) -> None:
    """Put `data` in place of the file at `path` (a legacy claim, under the folder's lock):
    written aside, synced, then renamed over it, so that a reader finds one or the other."""
    aside = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        _write_synced(aside, data)
        os.replace(aside, path)
    finally:
        aside.unlink(missing_ok=True)
    _sync_folder(path.parent)


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on `folder` (its own descriptor: no file is added)."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # releases the lock


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _create_exclusive(path: Path, data: bytes) -> bool:
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(descriptor, data)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    _sync_folder(path.parent)
    return True


def _sync_folder(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _path(root: Path) -> Path:
    return root / "_cdcflow" / WRITER_FILE


def _claim_of(root: Path) -> dict[str, str] | None:
    path = _path(root)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if not data:  # only where an exclusive create stands in for the link
        raise Unavailable(
            f"the claim '{os.path.abspath(path)}' of the CDC table '{os.path.abspath(root)}' "
            "is empty: another writer is making it, or was killed while it did; if no "
            "other stream is starting, remove it")
    try:
        held = json.loads(data)
    except ValueError:  # UnicodeDecodeError too
        held = None
    if not (isinstance(held, dict) and all(isinstance(held.get(k), str)
                                           for k in ("writer", "what", "object"))):
        raise FailedPrecondition(
            f"the claim '{os.path.abspath(path)}' of the CDC table '{os.path.abspath(root)}' "
            "is not the JSON object {writer, what, object} that cdcflow writes there (damaged "
            "or edited by hand): remove it, and the first stream to open the table claims it "
            "again")
    return held
