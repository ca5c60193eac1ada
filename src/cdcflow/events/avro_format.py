"""Avro for events through fastavro (EV-2): one file per object; the payload record holds the
values by column position and the Avro schema in the file header names them and gives their
unified types. Every column type of the embedded database maps:

INT64 long, FLOAT64 double, BOOL boolean, STRING string, BYTES bytes, DATE int/date,
TIMESTAMP long/timestamp-micros, NUMERIC bytes/decimal (38, 9 by default, or the column's
own precision and scale), JSON string (JSON text),
ARRAY<T> array of nullable T; every column is nullable.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator
from decimal import Decimal
from typing import IO, Any, cast

import fastavro

from cdcflow.errors import CdcflowError, DataLoss, InvalidArgument
from cdcflow.model.events import Event
from cdcflow.model.records import ColumnTypeInfo
from cdcflow.model.source import EMBEDDED, SourceKind, kind_of
from cdcflow.model.types import ColumnType

_COLUMN_TYPES = "cdcflow.column_types"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MILLIS = {"type": "long", "logicalType": "timestamp-millis"}
_GENERIC_METADATA: dict[str, Any] = {
    "table": "string", "change_type": "string", "is_deleted": "boolean",
    "primary_keys": {"type": "array", "items": "string"},
}
_GENERIC_DEFAULTS: dict[str, Any] = {
    "table": "", "change_type": "", "is_deleted": False, "primary_keys": []}
_LONG_FIELDS = frozenset({"log_position", "versions_seen"})


def _avro_type(ctype: ColumnType) -> Any:
    match ctype.code:
        case "ARRAY":
            assert ctype.element is not None
            return {"type": "array", "items": ["null", _avro_type(ctype.element)]}
        case "INT64":
            return "long"
        case "FLOAT64":
            return "double"
        case "BOOL":
            return "boolean"
        case "BYTES":
            return "bytes"
        case "DATE":
            return {"type": "int", "logicalType": "date"}
        case "TIMESTAMP":
            return {"type": "long", "logicalType": "timestamp-micros"}
        case "NUMERIC":
            integer, scale = ctype.numeric_digits
            return {"type": "bytes", "logicalType": "decimal", "precision": integer + scale,
                    "scale": scale}
        case _:
            return "string"


def _metadata_types(kind: SourceKind) -> dict[str, Any]:
    """Avro types of a kind's source metadata (EV-4): its own fields may be null."""
    own = [*(kind.object_fields or ()), *kind.fields]
    types: dict[str, Any] = {name: ["null", "long" if name in _LONG_FIELDS else "string"]
                             for name in dict.fromkeys(own) if name not in _GENERIC_METADATA}
    return types | _GENERIC_METADATA


def avro_schema(object_name: str, column_types: Iterable[ColumnTypeInfo],
                kind: SourceKind = EMBEDDED) -> dict[str, Any]:
    """The unified Avro schema of an object's events from one kind of source."""
    fields = []
    for column in column_types:
        if not _NAME.fullmatch(column.name):
            raise InvalidArgument(f"column name {column.name!r} is not a valid Avro name")
        fields.append({"name": column.name, "type": ["null", _avro_type(column.type)]})
    metadata = {"type": "record", "name": "SourceMetadata", "fields": [
        {"name": name, "type": kind_type} for name, kind_type in _metadata_types(kind).items()
    ]}
    safe = re.sub(r"[^A-Za-z0-9_]", "_", object_name)
    return {"type": "record", "name": "Event", "namespace": "cdcflow", "fields": [
        {"name": "stream_name", "type": "string"}, {"name": "read_method", "type": "string"},
        {"name": "object", "type": "string"}, {"name": "schema_key", "type": "string"},
        {"name": "uuid", "type": "string"}, {"name": "read_timestamp", "type": _MILLIS},
        {"name": "source_timestamp", "type": _MILLIS},
        {"name": "sort_keys", "type": {"type": "array", "items": ["string", "long"]}},
        {"name": "source_metadata", "type": metadata},
        {"name": "payload", "type": {"type": "record", "name": f"Payload_{safe}",
                                     "fields": fields}},
    ]}


def _to_avro(value: Any, ctype: ColumnType) -> Any:
    if value is None:
        return None
    if ctype.code == "JSON":
        return json.dumps(value, sort_keys=True)
    if ctype.code == "NUMERIC":
        return Decimal(value).quantize(Decimal(1).scaleb(-ctype.numeric_digits[1]))
    if ctype.code == "ARRAY":
        assert ctype.element is not None
        return [_to_avro(v, ctype.element) for v in value]
    return value


def _from_avro(value: Any, ctype: ColumnType) -> Any:
    if value is None:
        return None
    if ctype.code == "JSON":
        return json.loads(value)
    if ctype.code == "ARRAY":
        assert ctype.element is not None
        return [_from_avro(v, ctype.element) for v in value]
    return value


def write_avro(out: IO[bytes], events: list[Event], name: str | None = None) -> None:
    """Write events of one object (one schema) as an Avro container file. A file given its
    `name` takes its sync marker from it, so the same events under the same name give the
    same bytes (without one, the marker is random)."""
    if not events:
        raise InvalidArgument("an Avro event file needs at least one event")
    first = events[0]
    kind = kind_of(first.read_method)
    schema = fastavro.parse_schema(avro_schema(first.object, first.column_types, kind))
    names = _metadata_types(kind)
    records = []
    for event in events:
        if event.schema_key != first.schema_key or kind_of(event.read_method) != kind:
            raise InvalidArgument(
                f"event {event.uuid} has schema_key {event.schema_key} from a "
                f"{kind_of(event.read_method).name} source, not {first.schema_key} from a "
                f"{kind.name} source: one Avro file holds one schema"
            )
        records.append({
            "stream_name": event.stream_name, "read_method": event.read_method,
            "object": event.object, "schema_key": event.schema_key, "uuid": event.uuid,
            "read_timestamp": event.read_timestamp, "source_timestamp": event.source_timestamp,
            "sort_keys": list(event.sort_keys),
            "source_metadata": {k: event.source_metadata.get(k, _GENERIC_DEFAULTS.get(k))
                                for k in names},
            "payload": {c.name: _to_avro(event.payload.get(c.name), c.type)
                        for c in event.column_types},
        })
    column_types = json.dumps([c.to_dict() for c in first.column_types])
    marker = (os.urandom(16) if name is None
              else hashlib.blake2b(name.encode(), digest_size=16).digest())
    fastavro.writer(out, schema, records, metadata={_COLUMN_TYPES: column_types},
                    sync_marker=marker)


def read_avro(source: IO[bytes]) -> Iterator[Event]:
    """Events back from an Avro file written by `write_avro`; a damaged file is DataLoss
    naming it (a file cut at a block boundary reads short: compare with the manifest)."""
    name = getattr(source, "name", "the Avro input")
    try:
        reader = fastavro.reader(source)
        column_types = tuple(ColumnTypeInfo.from_dict(c)
                             for c in json.loads(reader.metadata[_COLUMN_TYPES]))
        yield from (_event_of(cast(dict[str, Any], raw), column_types) for raw in reader)
    except CdcflowError:
        raise
    except Exception as error:  # fastavro reports damage as EOFError, ValueError, ...
        raise DataLoss(f"event file {name} is not a whole cdcflow Avro file "
                       f"({type(error).__name__}: {error}); the file is damaged") from None


def _event_of(record: dict[str, Any], column_types: tuple[ColumnTypeInfo, ...]) -> Event:
    payload = {c.name: _from_avro(record["payload"][c.name], c.type) for c in column_types}
    return Event(
        stream_name=record["stream_name"], read_method=record["read_method"],
        object=record["object"], schema_key=record["schema_key"], uuid=record["uuid"],
        read_timestamp=record["read_timestamp"],
        source_timestamp=record["source_timestamp"],
        sort_keys=tuple(record["sort_keys"]), source_metadata=record["source_metadata"],
        payload=payload, column_types=column_types,
    )
