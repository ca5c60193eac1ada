"""Whose CDC table a folder is, among the tables one caller opens.

A CDC table lives at `<warehouse>/<object>`. On a filesystem that folds case (macOS's by
default), objects whose names differ only in letter case (`public.Orders`, `public.orders`;
PostgreSQL, MySQL and the embedded database all allow both) reach one folder, and would
commit into one Delta table. `TableFolders` knows each folder it was told of by its identity
on the disk, so a second object whose folder is one of them is refused before its table is
opened.

A CDC table has one writer too: `claim` records in its folder which stream (or change
stream) applies into it and for which object, the first time that writer opens it. A second
writer, another stream given the same warehouse and an object of the same name, is refused:
two writers' changes, each ordered by its own source, would overwrite each other's rows in
one table. The claim is in the folder, so it holds across processes and restarts, and on a
filesystem that folds case it catches two spellings of one name as well.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cdcflow.errors import FailedPrecondition

WRITER_FILE = "writer.json"
"""In a table's `_cdcflow` folder: {"writer", "what", "object"} of the one that applies."""


class TableFolders:
    """The table folders of the objects opened so far, by (device, inode)."""

    def __init__(self, remedy: str) -> None:
        self._objects: dict[tuple[int, int], str] = {}
        self.remedy = remedy
        """How the caller's user leaves one object out, for the message."""

    def check(self, root: Path, name: str) -> None:
        """FailedPrecondition if `root`, object `name`'s table folder, is another object's."""
        identity = _identity(root)
        other = None if identity is None else self._objects.get(identity)
        if other is not None and other != name:
            raise FailedPrecondition(
                f"objects {other!r} and {name!r} would share one CDC table: '{root}' is the "
                f"folder of {other!r} on this filesystem (one that does not tell letter case "
                f"apart sees one name); leave one of them out ({self.remedy}) or keep the "
                f"tables on a filesystem that tells case apart")

    def add(self, root: Path, name: str) -> None:
        """Object `name`'s table is at `root`, which exists."""
        identity = _identity(root)
        if identity is None:
            raise AssertionError(f"the table folder {root} of {name!r} does not exist")
        self._objects[identity] = name


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino


@dataclass(frozen=True, slots=True)
class TableWriter:
    """Who applies into a table: `writer` identifies it (a stream's checkpoint app id),
    `what` names it for people ("stream 'lake'"), for `object`; `remedy` says how its user
    gives it a table of its own."""

    writer: str
    what: str
    object: str
    remedy: str

    def check(self, root: Path) -> None:
        """FailedPrecondition if the table at `root` (if any) has another writer or
        object."""
        held = _claim_of(root)
        if held is None:
            return
        if held["writer"] != self.writer:
            raise FailedPrecondition(
                f"{self.what} would apply {self.object!r} into the CDC table '{root}', which "
                f"{held['what']} applies {held['object']!r} into: two writers, each in the "
                f"order of its own source, would overwrite each other's rows; {self.remedy}. "
                f"If {held['what']} is gone for good, remove '{_path(root)}' and this one "
                "takes the table over")
        if held["object"] != self.object:
            raise FailedPrecondition(
                f"objects {held['object']!r} and {self.object!r} would share one CDC table: "
                f"'{root}' is the folder of {held['object']!r} (a filesystem that does not "
                "tell letter case apart sees one name); leave one of them out or keep the "
                "tables on a filesystem that tells case apart")

    def claim(self, root: Path) -> None:
        """Record this writer as the table's (at `root`, which exists) unless one is, in one
        step no other writer can interleave with (a link that fails if the name exists);
        then `check` what is recorded."""
        path = _path(root)
        if not path.exists():
            aside = path.with_name(f".{WRITER_FILE}.{secrets.token_hex(8)}.tmp")
            aside.write_text(json.dumps({"writer": self.writer, "what": self.what,
                                         "object": self.object}))
            try:
                os.link(aside, path)
            except FileExistsError:
                pass  # another writer's link came first: checked below
            finally:
                aside.unlink()
        self.check(root)


def _path(root: Path) -> Path:
    return root / "_cdcflow" / WRITER_FILE


def _claim_of(root: Path) -> dict[str, str] | None:
    try:
        held: dict[str, str] = json.loads(_path(root).read_text())
    except FileNotFoundError:
        return None
    return held
