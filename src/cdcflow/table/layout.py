"""The baseline's files: key-range data files (Parquet, referenced by the Delta log) with a
state file each (winning order and tombstones per key, under `_cdcflow/state`), listed by a
manifest stored in the custom metadata of the Delta commit that made them current, so files,
manifest, watermark and applied pending files change together atomically.

A range may also be merge-on-read (tables with deletion_vectors): a deletion vector on its
base data file hides the rows changed since, and one patch (a data file in the Delta table and
a state file) holds those keys' rows and order. `read_file` returns the range merged.
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
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

from cdcflow.clock import Clock
from cdcflow.model.timestamps import parse_timestamp
from cdcflow.table.deletion_vectors import DeletionVector, kept_mask, read_vector
from cdcflow.table.merge import Key, key_array, order_text, state_schema

MANIFEST = "cdcflow.manifest"


@dataclass(frozen=True, slots=True)
class Patch:
    """The rows and order of the keys changed in a range since its base was written."""

    data: str
    state: str
    rows: int
    size: int


@dataclass(frozen=True, slots=True)
class FileEntry:
    data: str
    state: str
    low: Key
    rows: int  # rows in the base data file, deleted ones included
    size: int
    max_order: str | None = None  # the greatest order in the base state, if known
    vector: DeletionVector | None = None
    patch: Patch | None = None

    @property
    def live_rows(self) -> int:
        hidden = self.vector.cardinality if self.vector else 0
        return self.rows - hidden + (self.patch.rows if self.patch else 0)

    @property
    def merge_on_read(self) -> bool:
        return self.vector is not None or self.patch is not None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"data": self.data, "state": self.state,
                                "low": [_encode(v) for v in self.low], "rows": self.rows,
                                "size": self.size}
        if self.max_order is not None:
            body["max_order"] = self.max_order
        if self.vector is not None:
            body["vector"] = self.vector.to_json()
        if self.patch is not None:
            body["patch"] = {"data": self.patch.data, "state": self.patch.state,
                             "rows": self.patch.rows, "size": self.patch.size}
        return body

    @classmethod
    def from_json(cls, f: dict[str, Any]) -> FileEntry:
        vector = DeletionVector.from_json(f["vector"]) if "vector" in f else None
        patch = Patch(**f["patch"]) if "patch" in f else None
        return cls(f["data"], f["state"], tuple(_decode(v) for v in f["low"]), f["rows"],
                   f["size"], f.get("max_order"), vector, patch)


@dataclass(frozen=True, slots=True)
class Manifest:
    files: tuple[FileEntry, ...]
    applied_pending: frozenset[str]
    watermark: int | None  # epoch micros
    version: int  # Delta version of the baseline it describes

    def to_json(self) -> str:
        return json.dumps({
            "files": [f.to_json() for f in self.files],
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
            files = tuple(FileEntry.from_json(f) for f in data["files"])
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
    """A range's live rows and its state, sorted by key (a patch merged in)."""
    data = read_data(root, entry, schema)
    state = pq.read_table(root / entry.state).cast(state_schema(schema, primary_key))
    if entry.patch is None:
        return data, state
    patch_state = read_patch_state(root, entry, schema, primary_key)
    changed = key_array(patch_state, primary_key)
    state = state.filter(pc.invert(pc.is_in(key_array(state, primary_key), value_set=changed)))
    order = [(k, "ascending") for k in primary_key]
    return data.sort_by(order), pa.concat_tables([state, patch_state]).sort_by(order)


def read_data(root: Path, entry: FileEntry, schema: pa.Schema) -> pa.Table:
    """A range's live rows: the base file less its deletion vector, then the patch's rows."""
    data = conform(pq.read_table(root / entry.data), schema)
    if entry.vector is not None:
        data = data.filter(pa.array(kept_mask(data.num_rows, read_vector(root, entry.vector))))
    if entry.patch is not None and entry.patch.rows:
        data = pa.concat_tables([data, conform(pq.read_table(root / entry.patch.data), schema)])
    return data


def read_patch_state(root: Path, entry: FileEntry, schema: pa.Schema,
                     primary_key: tuple[str, ...]) -> pa.Table:
    target = state_schema(schema, primary_key)
    if entry.patch is None:
        return target.empty_table()
    return pq.read_table(root / entry.patch.state).cast(target)


def greatest_order(state: pa.Table) -> str | None:
    if not state.num_rows:
        return None
    orders = order_text(state.column("_seq_key"), state.column("_ingest"), state.column("_row"))
    greatest: str = pc.max(orders).as_py()
    return greatest


def write_file(root: Path, data: pa.Table, state: pa.Table,
               primary_key: tuple[str, ...], clock: Clock) -> FileEntry:
    """Write one range's sorted data and state under fresh names; return its entry."""
    name = f"{clock.now().strftime('%Y%m%d')}-{uuid.uuid4().hex}.parquet"
    data_path, state_path = f"data/{name}", f"_cdcflow/state/{name}"
    (root / "data").mkdir(exist_ok=True)
    (root / "_cdcflow" / "state").mkdir(parents=True, exist_ok=True)
    write_sorted(data, root / data_path, primary_key)
    write_sorted(state, root / state_path, primary_key)
    first = state.slice(0, 1).to_pylist()
    low = tuple(first[0][k] for k in primary_key) if first else ()
    return FileEntry(data_path, state_path, low, data.num_rows,
                     os.path.getsize(root / data_path), greatest_order(state))


def write_sorted(table: pa.Table, path: Path, primary_key: tuple[str, ...]) -> None:
    """Write a table sorted by key; integer key columns are delta-encoded, which makes them
    several times faster to read (a merge-on-read apply reads a range's key column)."""
    integer_keys = [k for k in primary_key if pa.types.is_integer(table.schema.field(k).type)]
    others = [name for name in table.column_names if name not in integer_keys]
    pq.write_table(table, path, use_dictionary=others or False,
                   column_encoding={k: "DELTA_BINARY_PACKED" for k in integer_keys} or None)


def write_patch(root: Path, data: pa.Table, state: pa.Table, clock: Clock) -> Patch:
    """Write a range's patch under fresh names (no data file when it holds deletes only)."""
    name = f"{clock.now().strftime('%Y%m%d')}-{uuid.uuid4().hex}.parquet"
    data_path, state_path = f"data/{name}", f"_cdcflow/state/{name}"
    (root / "data").mkdir(exist_ok=True)
    (root / "_cdcflow" / "state").mkdir(parents=True, exist_ok=True)
    pq.write_table(state, root / state_path)
    if not data.num_rows:
        return Patch("", state_path, 0, 0)
    pq.write_table(data, root / data_path)
    return Patch(data_path, state_path, data.num_rows, os.path.getsize(root / data_path))
