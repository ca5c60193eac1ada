"""Whose CDC table a folder is, among the tables one caller opens.

A CDC table lives at `<warehouse>/<object>`. On a filesystem that folds case (macOS's by
default), objects whose names differ only in letter case (`public.Orders`, `public.orders`;
PostgreSQL, MySQL and the embedded database all allow both) reach one folder, and would
commit into one Delta table. `TableFolders` knows each folder it was told of by its identity
on the disk, so a second object whose folder is one of them is refused before its table is
opened.
(`cdcflow.table.writers` keeps one writer per table across processes and restarts.)
"""

from __future__ import annotations

import os
from pathlib import Path

from cdcflow.errors import FailedPrecondition


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

