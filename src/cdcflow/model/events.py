"""Events (EV-1..EV-7): one change of one object, as the whole row plus generic and
source-specific metadata, in the shape of the seed's example.

Read methods follow the seed's naming, `<source>-cdc-<mechanism>` and
`<source>-backfill-<mechanism>`: the embedded database emits `embedded-cdc-changestream` and
`embedded-backfill-snapshot`; the polling watcher will emit `watcher-cdc-poll`, PostgreSQL
`postgres-cdc-wal` / `postgresql-backfill`, MySQL `mysql-cdc-binlog` /
`mysql-backfill-fulldump`.

The uuid is a name-based UUID of the change's position, so a redelivered change carries the
same uuid and a destination drops duplicates by it (EV-7). `sort_keys` orders the events of one
object as they happened (EV-6): (commit micros, transaction id, record sequence, mod index).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from cdcflow.model.records import ColumnTypeInfo, DataChangeRecord
from cdcflow.model.timestamps import to_micros
from cdcflow.model.types import encode_value

EMBEDDED_CDC: Final = "embedded-cdc-changestream"
EMBEDDED_BACKFILL: Final = "embedded-backfill-snapshot"
WATCHER_CDC: Final = "watcher-cdc-poll"
_NAMESPACE: Final = uuid.UUID("6c1d3a52-4f7e-4a7e-9b7c-3c2f6f2d9a10")


@dataclass(frozen=True, slots=True)
class Event:
    """One change of one object: payload (the whole row), generic and source metadata."""

    stream_name: str
    read_method: str
    object: str
    schema_key: str
    uuid: str
    read_timestamp: datetime
    source_timestamp: datetime
    sort_keys: tuple[str | int, ...]
    source_metadata: dict[str, Any]
    payload: dict[str, Any]
    column_types: tuple[ColumnTypeInfo, ...]

    @property
    def is_deleted(self) -> bool:
        return bool(self.source_metadata.get("is_deleted"))

    def to_json(self) -> dict[str, Any]:
        """Names and values (EV-2); timestamps as RFC 3339 millis. Values use the record
        encoding, except INT64 as text, as in the seed's example, so no reader loses digits."""
        return {
            "stream_name": self.stream_name,
            "read_method": self.read_method,
            "object": self.object,
            "schema_key": self.schema_key,
            "uuid": self.uuid,
            "read_timestamp": _millis_text(self.read_timestamp),
            "source_timestamp": _millis_text(self.source_timestamp),
            "sort_keys": list(self.sort_keys),
            "source_metadata": self.source_metadata,
            "payload": {c.name: _json_value(self.payload.get(c.name), c)
                        for c in self.column_types},
        }


def _millis_text(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def _json_value(value: Any, column: ColumnTypeInfo) -> Any:
    encoded = encode_value(value, column.type)
    if column.type.code == "INT64" and encoded is not None:
        return str(encoded)
    if column.type.code == "ARRAY" and column.type.element and column.type.element.code == "INT64":
        return [None if v is None else str(v) for v in encoded]
    return encoded


def schema_key(object_name: str, column_types: Iterable[ColumnTypeInfo]) -> str:
    """Identifies the unified schema: changes when a column, type or key changes."""
    text = json.dumps([object_name, [c.to_dict() for c in column_types]], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def change_uuid(stream_name: str, *position: str | int) -> str:
    return str(uuid.uuid5(_NAMESPACE, "/".join([stream_name, *map(str, position)])))


def event_from_mod(
    stream_name: str,
    database: str,
    record: DataChangeRecord,
    mod_index: int,
    row: dict[str, Any],
    read_timestamp: datetime,
    partition_token: str = "",
) -> Event:
    """The event of one mod; `row` is the whole new row (INSERT, UPDATE) or the deleted row
    (DELETE), as Python values (EV-5)."""
    keys = [c.name for c in record.column_types if c.is_primary_key]
    deleted = record.mod_type == "DELETE"
    metadata = {
        "database": database,
        "table": record.table_name,
        "change_type": record.mod_type,
        "is_deleted": deleted,
        "tx_id": record.server_transaction_id,
        "record_sequence": record.record_sequence,
        "partition_token": partition_token,
        "primary_keys": keys,
    }
    return Event(
        stream_name=stream_name,
        read_method=EMBEDDED_CDC,
        object=record.table_name,
        schema_key=schema_key(record.table_name, record.column_types),
        uuid=change_uuid(stream_name, record.table_name, record.server_transaction_id,
                         record.record_sequence, mod_index),
        read_timestamp=read_timestamp,
        source_timestamp=record.commit_timestamp,
        sort_keys=(to_micros(record.commit_timestamp), record.server_transaction_id,
                   record.record_sequence, mod_index),
        source_metadata=metadata,
        payload=dict(row),
        column_types=record.column_types,
    )


def backfill_event(
    stream_name: str,
    database: str,
    table: str,
    column_types: tuple[ColumnTypeInfo, ...],
    row: dict[str, Any],
    snapshot: datetime,
    read_timestamp: datetime,
) -> Event:
    """A backfill event: the row as of the snapshot; no order among backfill events (EV-6)."""
    keys = [c.name for c in column_types if c.is_primary_key]
    key_text = json.dumps([encode_value(row[c.name], c.type) for c in column_types
                           if c.is_primary_key])
    return Event(
        stream_name=stream_name,
        read_method=EMBEDDED_BACKFILL,
        object=table,
        schema_key=schema_key(table, column_types),
        uuid=change_uuid(stream_name, table, "backfill", to_micros(snapshot), key_text),
        read_timestamp=read_timestamp,
        source_timestamp=snapshot,
        sort_keys=(),
        source_metadata={"database": database, "table": table, "change_type": "INSERT",
                         "is_deleted": False, "tx_id": "", "record_sequence": "",
                         "partition_token": "", "primary_keys": keys},
        payload=dict(row),
        column_types=column_types,
    )


def row_of_mod(record: DataChangeRecord, mod_index: int,
               previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole row an event carries for a mod, as Python values (EV-5): the new row for
    INSERT/UPDATE, the deleted row for DELETE. Partial values (OLD_AND_NEW_VALUES and
    NEW_VALUES updates) are laid over `previous`, the row before this change."""
    keys, new, old = record.decoded_mods()[mod_index]
    columns = {c.name: None for c in record.column_types}
    if record.mod_type == "DELETE":
        return columns | (previous or {}) | old | keys
    if record.mod_type == "INSERT" or record.value_capture_type.startswith("NEW_ROW"):
        return columns | new | keys
    return columns | (previous or {}) | new | keys


def drop_duplicates(events: Iterable[Event], seen: set[str] | None = None) -> list[Event]:
    """Events whose uuid was not seen before (EV-7); `seen` carries over between calls."""
    known = set() if seen is None else seen
    fresh = []
    for event in events:
        if event.uuid not in known:
            known.add(event.uuid)
            fresh.append(event)
    return fresh
