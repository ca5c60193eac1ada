"""The event-file destination: `<root>/<stream>/<object>/YYYY/MM/DD/HH/mm/<file>.jsonl|.avro`.

Exactly once per batch id: a batch's files get names derived from the batch id, are written to
a temporary name and renamed into place (never a partial file), and a manifest
`<root>/<stream>/_manifests/batch-<id>.json` is written last, the same way. A batch whose
manifest exists is skipped; a batch cut short by a crash is written again under the same names,
replacing what it left; once it commits, what else its earlier attempts left beside its files
(aside files, files of another cut) is removed. Readers trust the files the manifests list
(`committed_files`).

Rotation: a file holds at most `max_events` events and about `max_bytes` bytes, and the events
of one file span at most `max_seconds` of source time; the minute folders rotate by time too.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import re
import unicodedata
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from cdcflow.errors import DataLoss, InvalidArgument
from cdcflow.events.avro_format import write_avro
from cdcflow.events.leftovers import aside_name, remove_leftovers, remove_unfinished_manifests
from cdcflow.model.events import Event
from cdcflow.model.timestamps import minute_text

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
    """`data` at `path`, whole: written aside under a name of this write's own, then moved,
    so that two writers of one path (a replayed task and one its killed driver left
    running) each move a whole file. A killed write leaves its aside file, until the batch
    commits (`cdcflow.events.leftovers`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(aside_name(path.name))
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


_STREAMING_MANIFEST = re.compile(r"batch-(\d{12,})\.json", re.ASCII)
"""A streaming batch's manifest (a backfill's are named by their keys)."""


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

    def last_batch(self) -> int | None:
        """The highest numbered streaming batch with a manifest (None: none)."""
        numbered = (_STREAMING_MANIFEST.fullmatch(m.name)
                    for m in (self.base / "_manifests").glob("batch-*.json"))
        return max((int(found[1]) for found in numbered if found), default=None)

    def write_part(self, batch_id: int | str, part: int, events: Iterable[Event],
                   layout: str = "") -> list[dict[str, Any]]:
        """Write one part of a batch (e.g. one Spark partition) under names derived from the
        batch, the `layout` of its parts (how the batch was cut into parts) and the part, so
        a replay laid out alike rewrites the same files with the same events, and one laid
        out otherwise writes other files. Objects whose names differ only in letter case
        (or in Unicode normalisation) number their files on from each other: a filesystem
        that folds case (macOS's by default) sees one folder, where same names would
        overwrite each other. Commit with `commit_batch`."""
        if layout and not layout.isalnum():
            raise InvalidArgument(f"part layout {layout!r} must be letters and digits")
        files: list[dict[str, Any]] = []
        cut = f"{layout}-" if layout else ""
        named: dict[tuple[str, str], int] = {}  # files per folder, as case folding sees it
        for (object_name, minute), group in sorted(self._groups(events).items()):
            chunks = self._rotate(group)
            first = named.get((_folded(object_name), minute), 0)
            named[(_folded(object_name), minute)] = first + len(chunks)
            for index, chunk in enumerate(chunks, start=first):
                suffix = "jsonl" if self.fmt == "json" else "avro"
                name = f"batch-{self._key(batch_id)}-{cut}p{part:05d}-{index:04d}.{suffix}"
                path = self.base / object_name / minute / name
                data = self._encode(chunk, name)
                _atomic_write(path, data)
                files.append({"path": str(path.relative_to(self.base)), "events": len(chunk),
                              "sha256": hashlib.sha256(data).hexdigest()})
        return files

    def commit_batch(self, batch_id: int | str, files: list[dict[str, Any]]) -> None:
        """Write the batch manifest, last: from now on the batch counts as written. Then
        remove what earlier attempts at the batch left beside its files
        (`cdcflow.events.leftovers`)."""
        manifest = {"batch": self._key(batch_id), "format": self.fmt, "files": files}
        _atomic_write(self.manifest_path(batch_id), json.dumps(manifest).encode())
        remove_leftovers(self.base, self._key(batch_id), [str(f["path"]) for f in files])

    def remove_leftovers(self, batch_id: int | str) -> list[Path]:
        """What `commit_batch` removes after the manifest, again: for a replay of a batch
        whose commit may have stopped before. A batch without a readable manifest: nothing."""
        try:
            listed = json.loads(self.manifest_path(batch_id).read_bytes())["files"]
            paths = [str(f["path"]) for f in listed]
        except (OSError, ValueError, KeyError, TypeError):
            return []
        return remove_leftovers(self.base, self._key(batch_id), paths)

    def remove_unfinished_manifests(self) -> list[Path]:
        """Delete the aside files of manifests that a driver killed mid-commit left
        (`cdcflow.events.leftovers.remove_unfinished_manifests`); only while no batch commits
        to this root, as a query starts. Return what was deleted."""
        return remove_unfinished_manifests(self.base / "_manifests")

    def write_batch(self, batch_id: int | str, events: Iterable[Event]) -> list[str]:
        """Write one batch; return the files it holds ([] when it was written before)."""
        if self.is_committed(batch_id):
            return []
        files = self.write_part(batch_id, 0, events)
        self.commit_batch(batch_id, files)
        return [str(f["path"]) for f in files]

    def committed_files(self) -> list[Path]:
        """Every file listed by a batch manifest, in batch order."""
        return [part.path for part in self.committed_parts()]

    def committed_parts(self) -> list[CommittedFile]:
        """Every file listed by a batch manifest, with what the manifest says of it, in
        batch order. A damaged manifest, a manifest missing between two others, or a listed
        file that is missing, is DataLoss naming it."""
        out = []
        manifests = sorted((self.base / "_manifests").glob("batch-*.json"))
        _check_no_gap(manifests)
        for manifest in manifests:
            try:
                listed = [CommittedFile(self.base / str(f["path"]), int(f["events"]),
                                        f.get("sha256"), manifest) for f in
                          json.loads(manifest.read_text(encoding="utf-8"))["files"]]
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                raise DataLoss(f"event manifest {manifest} is damaged ({type(error).__name__}: "
                               f"{error}); a manifest lists its batch's files") from None
            for part in listed:
                if not part.path.is_file():
                    raise DataLoss(f"event file {part.path}, listed by {manifest}, is missing")
            out += listed
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

    def _encode(self, chunk: list[tuple[Event, bytes]], name: str) -> bytes:
        """The bytes of a file: the same for the same events under the same name."""
        if self.fmt == "json":
            return b"".join(line for _, line in chunk)
        buffer = io.BytesIO()
        write_avro(buffer, [event for event, _ in chunk], name)
        return buffer.getvalue()


def _folded(name: str) -> str:
    """A folder name as a filesystem that folds case may see it: broader than any such
    filesystem's folding (APFS folds case and normalisation), so no two names it sees as one
    differ here."""
    return unicodedata.normalize("NFKD", unicodedata.normalize("NFKD", name).casefold())


def _minute_folder(when: datetime) -> str:
    """The folder of an event's minute, in its own zone; `strftime` runs once a minute, not
    once a transaction. The minute is remembered by its wall-clock fields (no zone): equal
    instants in two zones are two folders."""
    return minute_text("%Y/%m/%d/%H/%M", when.year, when.month, when.day, when.hour,
                       when.minute)


def json_line(event: Event) -> bytes:
    """One event as a line of JSON (orjson; the standard library for what orjson refuses,
    such as integers beyond 64 bits)."""
    fields = event.to_json()
    try:
        return orjson.dumps(fields) + b"\n"
    except TypeError:
        return (json.dumps(fields) + "\n").encode()


@dataclass(frozen=True, slots=True)
class CommittedFile:
    """A file a manifest lists: its path, how many events it holds, and the SHA-256 of its
    bytes (None in manifests written before cdcflow recorded it)."""

    path: Path
    events: int
    sha256: str | None
    manifest: Path

    def read_bytes(self) -> bytes:
        """The file's bytes, checked against the manifest: DataLoss naming it otherwise."""
        data = self.path.read_bytes()
        if self.sha256 is not None and hashlib.sha256(data).hexdigest() != self.sha256:
            raise DataLoss(f"event file {self.path} is damaged: its bytes differ from the "
                           f"SHA-256 its manifest {self.manifest} recorded")
        return data

    def json_events(self) -> list[dict[str, Any]]:
        return parse_json_events(self.path, self.read_bytes(), self.events)


def _check_no_gap(manifests: list[Path]) -> None:
    """Streaming batches are numbered one after another: a manifest missing between two
    that exist is a lost batch, not one cut short by a crash (that is only ever the last)."""
    numbers = sorted(int(m.stem[6:]) for m in manifests if m.stem[6:].isdigit())
    missing = next((n for n, m in itertools.pairwise(numbers) if m != n + 1), None)
    if missing is not None:
        lost = manifests[0].parent / f"batch-{missing + 1:012d}.json"
        raise DataLoss(f"event manifest {lost} is missing, between batches that were "
                       "committed: the batch is lost")


_EVENT_FIELDS = frozenset({"stream_name", "read_method", "object", "uuid", "sort_keys",
                           "source_metadata", "payload"})


def read_json_events(path: str | Path, expected: int | None = None) -> list[dict[str, Any]]:
    """The events of a JSON-lines file (see `parse_json_events`)."""
    return parse_json_events(path, Path(path).read_bytes(), expected)


def parse_json_events(path: str | Path, data: bytes,
                      expected: int | None = None) -> list[dict[str, Any]]:
    """The events of a JSON-lines file's bytes. A line that is not a whole event, or (with
    `expected`, the manifest's count) a file that holds another number of events, is
    DataLoss naming the file and the line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataLoss(f"event file {path} is not UTF-8 text ({error.reason} at byte "
                       f"{error.start}); the file is damaged") from None
    events = [_event_line(path, number, line)
              for number, line in enumerate(text.splitlines(), start=1) if line.strip()]
    check_count(path, len(events), expected)
    return events


def _event_line(path: str | Path, number: int, line: str) -> dict[str, Any]:
    try:
        event = json.loads(line)
    except json.JSONDecodeError as error:
        raise DataLoss(f"event file {path}: line {number} is not JSON ({error.msg} at column "
                       f"{error.colno}); the file is damaged") from None
    missing = _EVENT_FIELDS - set(event) if isinstance(event, dict) else _EVENT_FIELDS
    if missing:
        raise DataLoss(f"event file {path}: line {number} is not an event: it lacks "
                       f"{sorted(missing)}")
    return dict(event)


def check_count(path: str | Path, found: int, expected: int | None) -> None:
    if expected is not None and found != expected:
        raise DataLoss(f"event file {path} holds {found} events where its manifest says "
                       f"{expected}: the file is damaged")


def named_bytes(path: str | Path, data: bytes) -> io.BytesIO:
    """Bytes read from `path`, as a file object whose `name` says where they came from."""
    handle = io.BytesIO(data)
    handle.name = str(path)
    return handle
