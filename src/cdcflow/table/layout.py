"""The baseline's files: key-range data files (Parquet, referenced by the Delta log) with a
state file each (winning order and tombstones per key, under `_cdcflow/state`), listed by a
manifest stored in the custom metadata of the Delta commit that made them current, so files,
manifest, watermark and applied pending files change together atomically.
"""

from __future__ import annotations

import base64
import json
import os
import time
import uuid
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from cdcflow.model.timestamps import parse_timestamp
from cdcflow.table.merge import FileContent, Key, KeyState

MANIFEST = "cdcflow.manifest"
_STATE_FIELDS = [("_seq_key", pa.string()), ("_ingest", pa.int64()), ("_row", pa.int64()),
                 ("_deleted_at", pa.int64())]


@dataclass(frozen=True, slots=True)
class FileEntry:
    data: str
    state: str
    low: Key
    rows: int
    size: int


@dataclass(frozen=True, slots=True)
class Manifest:
    files: tuple[FileEntry, ...]
    applied_pending: frozenset[str]
    watermark: int | None  # epoch micros
    version: int  # Delta version of the baseline it describes

    def to_json(self) -> str:
        return json.dumps({
            "files": [{"data": f.data, "state": f.state, "low": [_encode(v) for v in f.low],
                       "rows": f.rows, "size": f.size} for f in self.files],
            "applied_pending": sorted(self.applied_pending),
            "watermark": self.watermark,
        })


def _encode(value: Any) -> Any:
    match value:
        case bool() | int() | float() | str():
            return value
        case bytes():
            return {"b": base64.b64encode(value).decode()}
        case datetime():
            return {"t": value.isoformat()}
        case date():
            return {"d": value.isoformat()}
        case Decimal():
            return {"n": str(value)}
    raise TypeError(f"unsupported key value {value!r}")


def _decode(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    tag, text = next(iter(value.items()))
    if tag == "b":
        return base64.b64decode(text)
    if tag == "t":
        return parse_timestamp(text)
    if tag == "d":
        return date.fromisoformat(text)
    return Decimal(text)


def read_manifest(table: DeltaTable) -> Manifest:
    """The manifest of the newest cdcflow commit (an empty one for a new table)."""
    for entry in table.history(50):
        text = entry.get(MANIFEST)
        if text:
            data = json.loads(text)
            files = tuple(FileEntry(f["data"], f["state"], tuple(_decode(v) for v in f["low"]),
                                    f["rows"], f["size"]) for f in data["files"])
            return Manifest(files, frozenset(data["applied_pending"]), data["watermark"],
                            table.version())
    return Manifest((), frozenset(), None, table.version())


def read_file(root: Path, entry: FileEntry, primary_key: tuple[str, ...]) -> FileContent:
    content = FileContent()
    for row in pq.read_table(root / entry.data).to_pylist():
        content.rows[tuple(row[k] for k in primary_key)] = row
    for row in pq.read_table(root / entry.state).to_pylist():
        key = tuple(row[k] for k in primary_key)
        order = (row["_seq_key"], row["_ingest"], row["_row"])
        content.state[key] = KeyState(order, row["_deleted_at"])
    return content


def write_file(root: Path, content: FileContent, schema: pa.Schema,
               primary_key: tuple[str, ...]) -> FileEntry:
    """Write one range's data and state files under fresh names; return its entry."""
    name = f"{time.strftime('%Y%m%d')}-{uuid.uuid4().hex}.parquet"
    data_path, state_path = f"data/{name}", f"_cdcflow/state/{name}"
    (root / "data").mkdir(exist_ok=True)
    (root / "_cdcflow" / "state").mkdir(parents=True, exist_ok=True)
    keys = sorted(content.rows)
    data = pa.Table.from_pylist([content.rows[k] for k in keys], schema=schema)
    pq.write_table(data, root / data_path)
    state_keys = sorted(content.state)
    key_fields = [schema.field(k) for k in primary_key]
    state_schema = pa.schema(key_fields + [pa.field(n, t) for n, t in _STATE_FIELDS])
    state_rows = []
    for key in state_keys:
        known = content.state[key]
        state_rows.append(dict(zip(primary_key, key, strict=True)) | {
            "_seq_key": known.order[0], "_ingest": known.order[1], "_row": known.order[2],
            "_deleted_at": known.deleted_at})
    pq.write_table(pa.Table.from_pylist(state_rows, schema=state_schema), root / state_path)
    low = content.lowest_key()
    return FileEntry(data_path, state_path, low if low is not None else (),
                     data.num_rows, os.path.getsize(root / data_path))
