"""The event-file destination: `<root>/<stream>/<object>/YYYY/MM/DD/HH/mm/<file>.jsonl|.avro`.

Exactly once per batch id: a batch's files get names derived from the batch id, are written to
a temporary name and renamed into place (never a partial file), and a manifest
`<root>/<stream>/_manifests/batch-<id>.json` is written last, the same way. A batch whose
manifest exists is skipped; a batch cut short by a crash is written again under the same names,
replacing what it left. Readers trust the files the manifests list (`committed_files`).

Rotation: a file holds at most `max_events` events and about `max_bytes` bytes, and the events
of one file span at most `max_seconds` of source time; the minute folders rotate by time too.
"""

from __future__ import annotations

import functools
import io
import json
import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from cdcflow.errors import InvalidArgument
from cdcflow.events.avro_format import write_avro
from cdcflow.model.events import Event

FORMATS = ("json", "avro")


@dataclass(frozen=True, slots=True)
class Rotation:
    max_events: int = 10_000
    max_bytes: int = 64 * 1024 * 1024
    max_seconds: float = 60.0

    def __post_init__(self) -> None:
        if self.max_events < 1 or self.max_bytes < 1 or self.max_seconds <= 0:
            raise InvalidArgument(f"rotation limits must be positive, got {self}")


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


class EventFileWriter:
    """Writes batches of events of one stream as files, exactly once per batch id."""

    def __init__(self, root: str | Path, stream_name: str, fmt: str = "json",
                 rotation: Rotation | None = None) -> None:
        if fmt not in FORMATS:
            raise InvalidArgument(f"format {fmt!r} is not one of {FORMATS}")
        if not stream_name or "/" in stream_name or stream_name.startswith("."):
            raise InvalidArgument(f"stream name {stream_name!r} must be a plain folder name")
        self.base = Path(root) / stream_name
        self.fmt = fmt
        self.rotation = rotation or Rotation()

    @staticmethod
    def _key(batch_id: int | str) -> str:
        if isinstance(batch_id, int):
            if batch_id < 0:
                raise InvalidArgument(f"batch id {batch_id} must not be negative")
            return f"{batch_id:012d}"
        if not batch_id or "/" in batch_id:
            raise InvalidArgument(f"batch key {batch_id!r} must be a plain name")
        return batch_id

    def manifest_path(self, batch_id: int | str) -> Path:
        return self.base / "_manifests" / f"batch-{self._key(batch_id)}.json"

    def is_committed(self, batch_id: int | str) -> bool:
        return self.manifest_path(batch_id).exists()

    def write_part(self, batch_id: int | str, part: int,
                   events: Iterable[Event]) -> list[dict[str, Any]]:
        """Write one part of a batch (e.g. one Spark partition) under names derived from the
        batch and part, so a replay rewrites the same files. Commit with `commit_batch`."""
        files: list[dict[str, Any]] = []
        for (object_name, minute), group in sorted(self._groups(events).items()):
            for index, chunk in enumerate(self._rotate(group)):
                suffix = "jsonl" if self.fmt == "json" else "avro"
                name = f"batch-{self._key(batch_id)}-p{part:05d}-{index:04d}.{suffix}"
                path = self.base / object_name / minute / name
                _atomic_write(path, self._encode(chunk))
                files.append({"path": str(path.relative_to(self.base)), "events": len(chunk)})
        return files

    def commit_batch(self, batch_id: int | str, files: list[dict[str, Any]]) -> None:
        """Write the batch manifest, last: from now on the batch counts as written."""
        manifest = {"batch": self._key(batch_id), "format": self.fmt, "files": files}
        _atomic_write(self.manifest_path(batch_id), json.dumps(manifest).encode())

    def write_batch(self, batch_id: int | str, events: Iterable[Event]) -> list[str]:
        """Write one batch; return the files it holds ([] when it was written before)."""
        if self.is_committed(batch_id):
            return []
        files = self.write_part(batch_id, 0, events)
        self.commit_batch(batch_id, files)
        return [str(f["path"]) for f in files]

    def committed_files(self) -> list[Path]:
        """Every file listed by a batch manifest, in batch order."""
        out = []
        for manifest in sorted((self.base / "_manifests").glob("batch-*.json")):
            out += [self.base / f["path"] for f in json.loads(manifest.read_text())["files"]]
        return out

    def _groups(self, events: Iterable[Event]) -> dict[tuple[str, str], list[Event]]:
        groups: dict[tuple[str, str], list[Event]] = defaultdict(list)
        for event in events:
            groups[(event.object, _minute_folder(event.source_timestamp))].append(event)
        return groups

    def _rotate(self, events: list[Event]) -> list[list[tuple[Event, bytes]]]:
        """Chunks of (event, its JSON line): each event is encoded once, for its size and,
        in the JSON format, for the file."""
        events = sorted(events, key=lambda e: (e.schema_key, e.source_timestamp, e.uuid))
        chunks: list[list[tuple[Event, bytes]]] = []
        size = 0
        for event in events:
            line = json_line(event)
            current = chunks[-1][0][0] if chunks else None
            if (current is None or len(chunks[-1]) >= self.rotation.max_events
                    or size + len(line) > self.rotation.max_bytes
                    or event.schema_key != current.schema_key
                    or (event.source_timestamp - current.source_timestamp).total_seconds()
                    > self.rotation.max_seconds):
                chunks.append([])
                size = 0
            chunks[-1].append((event, line))
            size += len(line)
        return chunks

    def _encode(self, chunk: list[tuple[Event, bytes]]) -> bytes:
        if self.fmt == "json":
            return b"".join(line for _, line in chunk)
        buffer = io.BytesIO()
        write_avro(buffer, [event for event, _ in chunk])
        return buffer.getvalue()


@functools.lru_cache(maxsize=4096)
def _minute_folder(when: datetime) -> str:
    """The folder of an event's minute (the events of a transaction share their time)."""
    return when.strftime("%Y/%m/%d/%H/%M")


def json_line(event: Event) -> bytes:
    """One event as a line of JSON (orjson; the standard library for what orjson refuses,
    such as integers beyond 64 bits)."""
    fields = event.to_json()
    try:
        return orjson.dumps(fields) + b"\n"
    except TypeError:
        return (json.dumps(fields) + "\n").encode()


def read_json_events(path: str | Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]
