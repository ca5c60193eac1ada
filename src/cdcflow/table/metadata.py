"""Table options (primary key, max_staleness, delete retention, file size, deletion vectors,
file retention) in `<root>/_cdcflow/table.json`, written atomically."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from cdcflow.errors import InvalidArgument, NotFound

MIN_FILE_RETENTION_SECONDS = 3600.0
"""The shortest time a file no version uses any more is kept (`cdcflow.table.vacuum`), and the
default: readers and batches must never take longer."""
MAX_FILE_RETENTION_SECONDS = 7 * 86_400.0
"""The longest: a vacuum reads the versions of the whole retention in the table's Delta log,
which delta-rs cleans of commits older than 30 days."""


@dataclass(frozen=True, slots=True)
class TableOptions:
    primary_key: tuple[str, ...]
    max_staleness_seconds: float | None
    delete_retention_seconds: float
    target_file_rows: int
    deletion_vectors: bool = False
    file_retention_seconds: float = MIN_FILE_RETENTION_SECONDS

    def validated(self) -> TableOptions:
        if self.max_staleness_seconds is not None and self.max_staleness_seconds <= 0:
            raise InvalidArgument(
                f"max_staleness {timedelta(seconds=self.max_staleness_seconds)} must be positive"
            )
        if self.delete_retention_seconds < 0:
            raise InvalidArgument("delete_retention must not be negative")
        if self.target_file_rows < 1:
            raise InvalidArgument(f"target_file_rows {self.target_file_rows} must be positive")
        if not isinstance(self.deletion_vectors, bool):
            raise InvalidArgument(
                f"deletion_vectors {self.deletion_vectors!r} must be True or False")
        if not (MIN_FILE_RETENTION_SECONDS <= self.file_retention_seconds
                <= MAX_FILE_RETENTION_SECONDS):
            raise InvalidArgument(
                f"file_retention {timedelta(seconds=self.file_retention_seconds)} must be from "
                f"{timedelta(seconds=MIN_FILE_RETENTION_SECONDS)} (a read or a batch that takes "
                f"longer would lose its files) to {timedelta(seconds=MAX_FILE_RETENTION_SECONDS)}"
                " (the Delta log must still hold its versions)")
        return self

    def public(self) -> dict[str, Any]:
        """Options as read back from table metadata (AP-5)."""
        staleness = self.max_staleness_seconds
        return {
            "primary_key": list(self.primary_key),
            "max_staleness": None if staleness is None else timedelta(seconds=staleness),
            "delete_retention": timedelta(seconds=self.delete_retention_seconds),
            "target_file_rows": self.target_file_rows,
            "deletion_vectors": self.deletion_vectors,
            "file_retention": timedelta(seconds=self.file_retention_seconds),
        }

    def altered(self, **changes: Any) -> TableOptions:
        values: dict[str, Any] = {}
        for name, value in changes.items():
            if name == "max_staleness":
                values["max_staleness_seconds"] = None if value is None else _seconds(value)
            elif name == "delete_retention":
                values["delete_retention_seconds"] = _seconds(value)
            elif name == "target_file_rows":
                values["target_file_rows"] = int(value)
            elif name == "deletion_vectors":
                values["deletion_vectors"] = value
            elif name == "file_retention":
                values["file_retention_seconds"] = _seconds(value)
            else:
                raise InvalidArgument(
                    f"option {name!r} cannot be altered; use max_staleness, delete_retention, "
                    "target_file_rows, deletion_vectors or file_retention"
                )
        return replace(self, **values).validated()


def _seconds(value: Any) -> float:
    if not isinstance(value, timedelta):
        raise InvalidArgument(f"{value!r} must be a datetime.timedelta")
    return value.total_seconds()


def meta_dir(root: str | Path) -> Path:
    return Path(root) / "_cdcflow"


def save_options(root: str | Path, options: TableOptions) -> None:
    folder = meta_dir(root)
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / f".table.json.{os.getpid()}"
    temporary.write_text(json.dumps(asdict(options)))
    os.replace(temporary, folder / "table.json")


def load_options(root: str | Path) -> TableOptions:
    path = meta_dir(root) / "table.json"
    if not path.exists():
        raise NotFound(f"{root} is not a cdcflow CDC table (no {path})")
    data = json.loads(path.read_text())
    return TableOptions(
        tuple(data["primary_key"]),
        data["max_staleness_seconds"],
        data["delete_retention_seconds"],
        data["target_file_rows"],
        data.get("deletion_vectors", False),
        data.get("file_retention_seconds", MIN_FILE_RETENTION_SECONDS),
    )
