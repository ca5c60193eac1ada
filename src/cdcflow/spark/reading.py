"""What one Spark task reads: a partition's records in (after, until], or a key-hash range of a
table snapshot. Stateless: every call opens its own database connection (executor side)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson
import pyarrow as pa

from cdcflow.model.collector import collector_paused
from cdcflow.model.partitions import PartitionMetadata
from cdcflow.model.source import EMBEDDED
from cdcflow.model.timestamps import format_rfc3339, from_micros, parse_timestamp, to_micros
from cdcflow.spark.options import SourceOptions
from cdcflow.spark.schema import CHANGE_COLUMNS, RAW_COLUMNS, arrow_of, table_columns
from cdcflow.spark.worker_heap import settle_task_heap
from cdcflow.store.changelog import open_log
from cdcflow.store.database import Database
from cdcflow.store.segments import (
    Segment,
    SnapshotFile,
    read_segment,
    read_snapshot_file,
    seal,
    seal_snapshot,
    snapshot_sealed,
)

_BATCH_ROWS = 8_192
SEGMENT_BYTES = 1 << 20
"""About this many bytes of log entries per segment: a partition's slice of a batch is read by
as many tasks as it has segments (clusters)."""
_COMPACT = (",", ":")


@dataclass(frozen=True, slots=True)
class ChangeSlice:
    """Records of one change-stream partition with after < commit_timestamp <= until.
    `partition_end` (micros or None) lets raw reads include the child-partitions record."""

    database: str
    stream: str
    token: str
    after: int
    until: int
    partition_end: int | None
    heartbeat_ms: int
    raw: bool
    segment_root: str | None = None
    """Set: executors read the slice's sealed segment under this root, not the log."""

    def read_until(self) -> int:
        """The end of the range read: raw reads take the child-partitions record at the
        partition's end too."""
        if self.raw and self.partition_end is not None and self.partition_end == self.until + 1:
            return self.partition_end
        return self.until

    def segment(self) -> Segment:
        assert self.segment_root is not None
        return Segment(self.segment_root, self.token, self.after, self.read_until())


@dataclass(frozen=True, slots=True)
class SnapshotSlice:
    """Rows of `table` as of `read_micros` whose key hash is in [hash_start, hash_end)."""

    database: str
    table: str
    read_micros: int
    hash_start: int
    hash_end: int
    segment_root: str | None = None
    """Set: executors read the slice's rows from a file the driver wrote under this root."""

    source: str = ""
    """With a segment root: the database file as the driver saw it (`snapshot_source`)."""

    def place(self) -> SnapshotFile:
        assert self.segment_root is not None
        return SnapshotFile(self.segment_root, self.table, self.read_micros, self.hash_start,
                            self.hash_end, self.source)


def change_slices(options: SourceOptions, partitions: list[PartitionMetadata], after: int,
                  until: int) -> list[ChangeSlice]:
    """One slice per partition whose span meets [after + 1, until]."""
    assert options.stream is not None
    out = []
    for p in partitions:
        start = to_micros(p.start_timestamp)
        end = None if p.end_timestamp is None else to_micros(p.end_timestamp)
        if start <= until and (end is None or end > after + 1):
            out.append(ChangeSlice(options.database, options.stream, p.token,
                                   max(after, start - 1),
                                   until if end is None else min(until, end - 1), end,
                                   options.heartbeat_ms, options.raw, options.segment_root))
    return out


def seal_slices(pieces: Sequence[ChangeSlice]) -> list[ChangeSlice]:
    """Driver side: seal the segments of the slices that have a segment root (the log is on
    this machine; see `cdcflow.store.segments`); the slices the tasks then read. A slice whose
    entries hold more than SEGMENT_BYTES becomes several, each its own segment and task, cut
    between commit timestamps: a transaction's records in a partition stay in one. The cuts
    depend only on the log's entries, so a replayed batch seals the same segments; the
    entries are read as a stream, about one segment's worth in memory at a time."""
    out = []
    for piece in pieces:
        if piece.segment_root is None:
            out.append(piece)
            continue
        entries = open_log(piece.database).read_log_texts(
            piece.stream, piece.token, from_micros(piece.after), from_micros(piece.read_until()))
        for part, chunk in _cut(piece, entries):
            seal(part.segment(), chunk)
            out.append(part)
    return out


def _cut(piece: ChangeSlice, entries: Iterator[tuple[str, int, str]]
         ) -> Iterator[tuple[ChangeSlice, list[tuple[str, int, str]]]]:
    """The slice in parts of about SEGMENT_BYTES of bodies, each with its entries. Raw reads
    stay whole: their heartbeat and child-partitions rows belong to the partition's end."""
    chunk: list[tuple[str, int, str]] = []
    size, after = 0, piece.after
    for entry in entries:
        if chunk and size >= SEGMENT_BYTES and entry[1] != chunk[-1][1] and not piece.raw:
            yield replace(piece, after=after, until=chunk[-1][1]), chunk
            chunk, size, after = [], 0, chunk[-1][1]
        chunk.append(entry)
        size += len(entry[2])
    yield replace(piece, after=after), chunk


def slice_bodies(piece: ChangeSlice) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """(kind, commit micros, record dict) of the slice's log entries: whole records."""
    for kind, micros, record, types in slice_parts(piece):
        if types is not None:  # the column types first, as in the body the writer made
            record = {"column_types": orjson.loads(types), **record}
        yield kind, micros, record


def slice_parts(piece: ChangeSlice) -> Iterator[tuple[str, int, dict[str, Any], str | None]]:
    """`slice_bodies` with a data record's column types apart when the log keeps them apart:
    (kind, micros, the record without them, their JSON text); None and the whole record
    else. Column types come as text to a row anyway: not parsed, they need no encoding."""
    if piece.segment_root is not None:
        table = read_segment(piece.segment())
        columns = [table.column(name).to_pylist() for name in ("kind", "commit_micros", "body")]
        for kind, micros, body in zip(*columns, strict=True):
            yield kind, micros, orjson.loads(body), None
        return
    database = open_log(piece.database)
    for kind, micros, body, types in database.read_log_parts(
            piece.stream, piece.token, from_micros(piece.after),
            from_micros(piece.read_until())):
        yield kind, micros, orjson.loads(body), types


def _batch(rows: list[tuple[Any, ...]], schema: pa.Schema) -> pa.RecordBatch:
    """Rows (tuples in schema order) as one record batch; transposed by `zip`, in C.
    Timestamps come as microseconds: an int64 array viewed as timestamps costs a tenth of
    converting datetimes."""
    columns = zip(*rows, strict=True)
    return pa.RecordBatch.from_arrays(
        [_array(c, f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
    )


def _array(values: Sequence[Any], kind: pa.DataType) -> pa.Array:
    if pa.types.is_timestamp(kind):
        return pa.array(values, type=pa.int64()).view(kind)
    return pa.array(values, type=kind)


def _source_columns(record: dict[str, Any], micros: int) -> tuple[str, int, dict[str, Any]]:
    """read_method, source_timestamp (micros) and the transaction's source fields of a log
    body; a native commit's block is derived from the record."""
    source = record.get("source")
    if source is None:
        return EMBEDDED.cdc_method, micros, {"tx_id": record["server_transaction_id"]}
    return (source["read_method"], _micros_of(source["source_timestamp"]),
            {"tx_id": source["tx_id"], **source["position"]})


@functools.lru_cache(maxsize=4096)
def _micros_of(text: str) -> int:
    """The records of a source transaction share its source timestamp: parsed once."""
    return to_micros(parse_timestamp(text))


def read_changes(piece: ChangeSlice) -> Iterator[pa.RecordBatch]:
    """One row per mod (or per raw record), as Arrow record batches; the cyclic collector
    is paused while they are made (no cycles among them: `cdcflow.model.collector`)."""
    settle_task_heap()
    if piece.raw:
        yield from _read_raw(piece)
        return
    with collector_paused():
        yield from _change_batches(piece)


def _change_batches(piece: ChangeSlice) -> Iterator[pa.RecordBatch]:
    schema = arrow_of(CHANGE_COLUMNS)
    rows: list[tuple[Any, ...]] = []
    for row in change_rows(piece):
        rows.append(row)
        if len(rows) >= _BATCH_ROWS:
            yield _batch(rows, schema)
            rows = []
    if rows:
        yield _batch(rows, schema)


def change_rows(piece: ChangeSlice, keep: Callable[[str, str], bool] | None = None
                ) -> Iterator[tuple[Any, ...]]:
    """The slice's mods in `CHANGE_COLUMNS` order, timestamps in micros; with `keep`, only
    those it takes by table name and keys (as JSON text), the others not encoded."""
    for kind, micros, record, types in slice_parts(piece):
        if kind == "data":
            yield from _mod_rows(record, micros, piece.token, keep, types)


def _encode(value: Any) -> str:
    return orjson.dumps(value).decode()


def _types_column(types: str) -> str:
    """The column types column of a record whose types the log kept as text: that text, the
    same as encoding them again when it holds no escape (the standard library's encoder,
    which wrote it, escapes more than orjson: non-ASCII, DEL)."""
    return types if "\\" not in types else _encode(orjson.loads(types))


def _mod_rows(record: dict[str, Any], micros: int, token: str,
              keep: Callable[[str, str], bool] | None = None, types: str | None = None
              ) -> Iterator[tuple[Any, ...]]:
    """A data record's rows in `CHANGE_COLUMNS` order: the record's values, once per mod
    (that `keep` takes). An empty object, a mod's usual old values, is not encoded again;
    nor are column types given as `types` text (see `_types_column`)."""
    read_method, source_stamp, source_fields = _source_columns(record, micros)
    first = (micros, record["server_transaction_id"], record["record_sequence"])
    shared = (record["table_name"], record["mod_type"], record["value_capture_type"],
              record["number_of_records_in_transaction"],
              record["number_of_partitions_in_transaction"],
              record["is_last_record_in_transaction_in_partition"], token)
    column_types = _encode(record["column_types"]) if types is None else _types_column(types)
    source_text = _encode(source_fields)
    for index, mod in enumerate(record["mods"]):
        keys = _encode(mod["keys"])
        if keep is not None and not keep(shared[0], keys):
            continue
        position, old = mod.get("position"), mod["old_values"]
        yield (*first, index, *shared, keys, _encode(mod["new_values"]),
               _encode(old) if old or old is None else "{}", column_types,
               read_method, source_stamp,
               _encode(source_fields | position) if position else source_text)


def _read_raw(piece: ChangeSlice) -> Iterator[pa.RecordBatch]:
    rows: list[tuple[str, str, Any, str]] = []
    for kind, _, record in slice_bodies(piece):
        if kind == "data":
            rows.append((piece.token, "data_change_record",
                         parse_timestamp(record["commit_timestamp"]), json.dumps(record)))
        else:
            children = [{"token": t, "parent_partition_tokens": p} for t, p in record["children"]]
            start = from_micros(record["start_micros"])
            text = json.dumps({"start_timestamp": format_rfc3339(start),
                               "record_sequence": "00000000", "child_partitions": children})
            rows.append((piece.token, "child_partitions_record", start, text))
    heartbeat = {"timestamp": format_rfc3339(piece.until)}
    rows.append((piece.token, "heartbeat_record", from_micros(piece.until), json.dumps(heartbeat)))
    schema = arrow_of(RAW_COLUMNS)
    yield pa.RecordBatch.from_arrays(
        [pa.array([r[i] for r in rows], type=schema.field(i).type) for i in range(4)],
        schema=schema,
    )


def snapshot_source(database: str) -> str:
    """A short name for a database file as this machine sees it: its absolute path and its
    inode (a database made again at the same path is another file)."""
    path = os.path.abspath(database)
    return hashlib.sha256(f"{path}\0{os.stat(path).st_ino}".encode()).hexdigest()[:12]


def seal_snapshot_slices(pieces: Sequence[SnapshotSlice]) -> None:
    """Driver side: write the rows of each slice that has a segment root under it, for
    executors that can't open the database. A replanned read finds them written and does
    not read the database again."""
    for piece in pieces:
        if piece.segment_root is None:
            continue
        database = Database.open(piece.database, create=False)
        arrow = pa.schema([(name, kind) for name, _, kind in
                           table_columns(database.table_schema(piece.table))])
        if not snapshot_sealed(piece.place(), arrow):
            seal_snapshot(piece.place(), arrow, _snapshot_rows(piece)[1])


def read_snapshot(piece: SnapshotSlice) -> Iterator[pa.RecordBatch]:
    """Typed rows of a table snapshot slice: from the database, or from the file the driver
    wrote under the slice's segment root."""
    settle_task_heap()
    if piece.segment_root is not None:
        yield from read_snapshot_file(piece.place()).to_batches(max_chunksize=_BATCH_ROWS)
        return
    yield from _snapshot_rows(piece)[1]


def _snapshot_rows(piece: SnapshotSlice) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """The Arrow schema of the slice's table, and its rows read from the database."""
    database = Database.open(piece.database, create=False)
    schema = database.table_schema(piece.table)
    columns = table_columns(schema)
    rows = database.scan(piece.table, from_micros(piece.read_micros),
                         (piece.hash_start, piece.hash_end))
    arrow = pa.schema([(name, kind) for name, _, kind in columns])
    return arrow, _snapshot_batches(rows, columns, schema.columns, arrow)


def _snapshot_batches(rows: list[dict[str, Any]], columns: list[tuple[str, str, Any]],
                      types: Sequence[Any], arrow: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Rows (dicts of Python values) as record batches of `arrow`; JSON as sorted text."""
    for offset in range(0, max(len(rows), 1), _BATCH_ROWS):
        chunk = rows[offset:offset + _BATCH_ROWS]
        if not chunk:
            return
        arrays = []
        for (name, _, kind), column in zip(columns, types, strict=True):
            values = [r[name] for r in chunk]
            if column.type.code == "JSON":
                values = [None if v is None else json.dumps(v, sort_keys=True) for v in values]
            arrays.append(pa.array(values, type=kind))
        yield pa.RecordBatch.from_arrays(arrays, schema=arrow)
