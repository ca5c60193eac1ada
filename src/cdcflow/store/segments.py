"""Sealed log segments: a partition's log entries in (after, until], as one immutable Arrow
IPC file under a storage root that every executor reaches (issue 15).

The SQLite log stays the hot tail and the source of truth, on the driver's machine. When the
driver plans a batch for executors, it seals each slice of the batch into a segment; an
executor reads the segment, never the log. A segment's name is its exact range,
`<root>/<token>/<after>-<until>.arrow`, and it appears whole (written aside, then renamed; a
single put on an object store), so a replayed batch finds it or seals it again, with the same
content: the log's entries in a closed range never change. Sealed ranges are the manifest
(`sealed_segments`). A reader deletes the segments a committed batch no longer needs
(`drop_segments_until`). Storage roots are local or NFS paths, or URIs of pyarrow's
filesystems (s3://, gs://, hdfs://...).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc as ipc

from cdcflow.errors import FailedPrecondition, InvalidArgument

SEGMENT_SCHEMA = pa.schema([("kind", pa.string()), ("commit_micros", pa.int64()),
                            ("body", pa.string())])
_SAFE_TOKEN = re.compile(r"[A-Za-z0-9_.-]+")
_NAME = re.compile(r"(-?[0-9]+)-(-?[0-9]+)\.arrow")
_UNFINISHED = re.compile(r"\.[0-9a-f]{32}\.part")
_USER_INFO = re.compile(r"(://)[^/@]*@")


def shown(root: str) -> str:
    """A storage root as messages and status show it: without the user and password a URI
    may carry (s3://KEY:SECRET@bucket/...)."""
    return _USER_INFO.sub(r"\1", root)


def storage(root: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and base path of a storage root: an absolute path, or a URI."""
    if "://" in root:
        try:
            return pafs.FileSystem.from_uri(root)  # type: ignore[no-any-return]
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as error:
            raise InvalidArgument(f"storage root {shown(root)!r} is not a URI pyarrow "
                                  f"reaches: {shown(str(error))}") from None
    if not root.startswith("/"):
        raise InvalidArgument(f"storage root {root!r} must be an absolute path or a URI, so "
                              "that it names the same place on every machine")
    return pafs.LocalFileSystem(), root.rstrip("/") or "/"


@dataclass(frozen=True, slots=True)
class Segment:
    """Where the segment of one partition's entries in (after, until] lives."""

    root: str
    token: str
    after: int
    until: int

    def folder(self) -> str:
        name = self.token if _SAFE_TOKEN.fullmatch(self.token) else quote(self.token, safe="")
        return str(PurePosixPath(storage(self.root)[1]) / name)

    def path(self) -> str:
        return f"{self.folder()}/{self.after}-{self.until}.arrow"


def _intact(filesystem: pafs.FileSystem, path: str, schema: pa.Schema = SEGMENT_SCHEMA
            ) -> bool:
    """The file at `path` is a whole file of `schema`: its Arrow IPC footer reads."""
    try:
        with filesystem.open_input_file(path) as source:
            return bool(ipc.open_file(source).schema.equals(schema))
    except (FileNotFoundError, pa.ArrowInvalid, OSError):
        return False


def seal(segment: Segment, entries: Sequence[tuple[str, int, str]]) -> int:
    """Write the segment from (kind, commit micros, JSON body) entries unless a whole one is
    there; returns its size in bytes. It is written aside and moved into place (on object
    stores a move is a server-side copy: the object appears whole)."""
    filesystem, _ = storage(segment.root)
    target = segment.path()
    if _intact(filesystem, target):
        return int(filesystem.get_file_info(target).size)
    columns = [list(column) for column in zip(*entries, strict=True)] or [[], [], []]
    table = pa.table(columns, schema=SEGMENT_SCHEMA)
    _write_aside(filesystem, segment.folder(), target, SEGMENT_SCHEMA, table.to_batches())
    return int(filesystem.get_file_info(target).size)


def _write_aside(filesystem: pafs.FileSystem, folder: str, target: str, schema: pa.Schema,
                 batches: Iterable[pa.RecordBatch]) -> None:
    """`batches` as an Arrow IPC file at `target`, written aside in `folder` and moved
    there."""
    filesystem.create_dir(folder, recursive=True)
    written = f"{folder}/.{uuid.uuid4().hex}.part"
    with filesystem.open_output_stream(written) as out, ipc.new_file(out, schema) as w:
        for batch in batches:
            w.write_batch(batch)
    filesystem.move(written, target)


@dataclass(frozen=True, slots=True)
class SnapshotFile:
    """Where the rows of `table` as of `read_micros` whose key hash is in [hash_start,
    hash_end) live, for executors that can't open the database: a table snapshot read with a
    storage root. Named apart from log segments (`.snapshot.arrow`), which commits drop."""

    root: str
    table: str
    read_micros: int
    hash_start: int
    hash_end: int
    source: str
    """Names the database file the rows come from, so another one's are never reused."""

    def folder(self) -> str:
        name = quote(f"{self.table}@{self.read_micros}-{self.source}", safe="@")
        return str(PurePosixPath(storage(self.root)[1]) / "snapshots" / name)

    def path(self) -> str:
        return f"{self.folder()}/{self.hash_start}-{self.hash_end}.snapshot.arrow"


def snapshot_sealed(place: SnapshotFile, schema: pa.Schema) -> bool:
    """A whole file of `schema` is there: the same snapshot of one file holds the same
    rows, so it need not be written again."""
    filesystem, _ = storage(place.root)
    return _intact(filesystem, place.path(), schema)


def seal_snapshot(place: SnapshotFile, schema: pa.Schema,
                  batches: Iterable[pa.RecordBatch]) -> None:
    """Write a snapshot slice's rows, batch by batch."""
    filesystem, _ = storage(place.root)
    _write_aside(filesystem, place.folder(), place.path(), schema, batches)


def read_snapshot_file(place: SnapshotFile) -> pa.Table:
    """A sealed snapshot slice; FailedPrecondition naming it when it is missing or damaged."""
    return _read_sealed(place.root, place.path(), "snapshot file",
                        "the driver writes it before the read's tasks run; is the root "
                        "shared with this executor?", "read the snapshot again")


def read_segment(segment: Segment) -> pa.Table:
    """A sealed segment's entries; FailedPrecondition naming it when it is not there or not
    whole."""
    return _read_sealed(segment.root, segment.path(), "log segment",
                        "the driver seals it before the batch's tasks run; is the root "
                        "shared with this executor, and is it one query's alone?",
                        "the batch seals it again when it is replayed")


def _read_sealed(root: str, path: str, what: str, when_missing: str,
                 when_damaged: str) -> pa.Table:
    """The Arrow IPC file at `path` under `root`; FailedPrecondition naming it, with
    `when_missing` or `when_damaged`, when it is not there or does not read whole."""
    filesystem, _ = storage(root)
    try:
        with filesystem.open_input_file(path) as source:
            return ipc.open_file(source).read_all()
    except FileNotFoundError as error:
        raise FailedPrecondition(f"{what} {shown(path)!r} is not in storage root "
                                 f"{shown(root)!r}: {when_missing}") from error
    except (pa.ArrowInvalid, OSError) as error:
        raise FailedPrecondition(f"{what} {shown(path)!r} can't be read ({error}): "
                                 f"{when_damaged}") from error


def _segment_files(root: str) -> list[tuple[Segment, int]]:
    """Every sealed segment under a root, with its size in bytes."""
    filesystem, base = storage(root)
    selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
    found = []
    for info in filesystem.get_file_info(selector):
        match = _NAME.fullmatch(info.base_name)
        if info.type == pafs.FileType.File and match:
            token = unquote(PurePosixPath(info.path).parent.name)
            found.append((Segment(root, token, int(match[1]), int(match[2])), int(info.size)))
    return found


def sealed_segments(root: str) -> list[Segment]:
    """Every sealed segment under a root, by token and range."""
    return sorted((s for s, _ in _segment_files(root)), key=lambda s: (s.token, s.after))


def drop_segments_until(root: str, micros: int) -> int:
    """Delete the segments that end at or before `micros` (a committed batch's end: no
    replay reads them again); returns how many went."""
    filesystem, _ = storage(root)
    gone = 0
    for segment in sealed_segments(root):
        if segment.until <= micros:
            try:
                filesystem.delete_file(segment.path())
                gone += 1
            except FileNotFoundError:
                pass
    return gone


def sweep_unfinished(root: str) -> int:
    """Delete the log segments a killed driver left half written (`.part` files beside the
    segments; snapshot files are a batch read's, left alone); returns how many went. Call
    it only where no seal of the root can be running: as its one query starts."""
    filesystem, base = storage(root)
    snapshots = f"{base}/snapshots/"
    selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
    gone = 0
    for info in filesystem.get_file_info(selector):
        if (info.type == pafs.FileType.File and _UNFINISHED.fullmatch(info.base_name)
                and not info.path.startswith(snapshots)):
            filesystem.delete_file(info.path)
            gone += 1
    return gone


def segment_summary(root: str) -> dict[str, object]:
    """What `streams status` says of a stream's segments: where, how many, how many bytes,
    and the end of the newest (micros; None when there is none)."""
    files = _segment_files(root)
    return {"root": shown(root), "files": len(files), "bytes": sum(size for _, size in files),
            "sealed_through": max((s.until for s, _ in files), default=None)}
