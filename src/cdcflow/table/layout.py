"""The baseline's files: key-range data files (Parquet, referenced by the Delta log) with a
state file each (winning order and tombstones per key, under `_cdcflow/state`), listed by a
manifest stored in the custom metadata of the Delta commit that made them current, so files,
manifest, watermark and applied pending files change together atomically.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from cdcflow.clock import Clock
from cdcflow.model.timestamps import parse_timestamp
from cdcflow.table.merge import Key, state_schema

MANIFEST = "cdcflow.manifest"


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


def conform(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """`data` in `schema`: columns added since it was written are NULL (schema evolution)."""
    columns = [data.column(f.name).cast(f.type) if f.name in data.column_names
               else pa.nulls(data.num_rows, f.type) for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def read_file(root: Path, entry: FileEntry, schema: pa.Schema,
              primary_key: tuple[str, ...]) -> tuple[pa.Table, pa.Table]:
    data = conform(pq.read_table(root / entry.data), schema)
    state = pq.read_table(root / entry.state).cast(state_schema(schema, primary_key))
    return data, state


def write_file(root: Path, data: pa.Table, state: pa.Table,
               primary_key: tuple[str, ...], clock: Clock) -> FileEntry:
    """Write one range's sorted data and state under fresh names; return its entry."""
    name = f"{clock.now().strftime('%Y%m%d')}-{uuid.uuid4().hex}.parquet"
    data_path, state_path = f"data/{name}", f"_cdcflow/state/{name}"
    (root / "data").mkdir(exist_ok=True)
    (root / "_cdcflow" / "state").mkdir(parents=True, exist_ok=True)
    pq.write_table(data, root / data_path)
    pq.write_table(state, root / state_path)
    first = state.slice(0, 1).to_pylist()
    low = tuple(first[0][k] for k in primary_key) if first else ()
    return FileEntry(data_path, state_path, low, data.num_rows,
                     os.path.getsize(root / data_path))
