"""Events (EV-1..EV-7): one change of one object, as the whole row plus generic and
source-specific metadata, in the shape of the seed's example.

Read methods follow the seed's naming, `<source>-cdc-<mechanism>` and
`<source>-backfill-<mechanism>`, and come from each record's source block
(`cdcflow.model.source`): the embedded database emits `embedded-cdc-changestream` and
`embedded-backfill-snapshot`, PostgreSQL `postgres-cdc-wal` / `postgresql-backfill`, MySQL
`mysql-cdc-binlog` / `mysql-backfill-fulldump`. The source metadata holds the fields EV-4 gives
for the record's kind of source, and `sort_keys` order the events as EV-6 gives for it.

The uuid is a name-based UUID of the change's position in the change log, so a redelivered
change carries the same uuid and a destination drops duplicates by it (EV-7).
"""

from __future__ import annotations

import functools
import hashlib
import json
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, Final, NamedTuple

import orjson

from cdcflow.model.memo import IdentityMemo
from cdcflow.model.records import ColumnTypeInfo, DataChangeRecord
from cdcflow.model.source import (
    EMBEDDED,
    ChangeContext,
    SourceKind,
    SourceMetadata,
    kind_of,
    object_parts,
)
from cdcflow.model.timestamps import minute_text, to_micros
from cdcflow.model.types import encode_value

EMBEDDED_CDC: Final = EMBEDDED.cdc_method
EMBEDDED_BACKFILL: Final = EMBEDDED.backfill_method
_NAMESPACE: Final = uuid.UUID("6c1d3a52-4f7e-4a7e-9b7c-3c2f6f2d9a10")
_NAMESPACE_BYTES: Final = _NAMESPACE.bytes


class Event(NamedTuple):
    """One change of one object: payload (the whole row), generic and source metadata.

    A named tuple rather than a frozen dataclass: as immutable, and built in a fifth of the
    time (a frozen dataclass sets each field through `object.__setattr__`); a batch builds
    one per change."""

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
            "payload": {name: encode(self.payload.get(name))
                        for name, encode in _payload_encoders(self.column_types)},
        }


_BACKFILL_DEFAULTS: dict[str, Any] = {"log_position": 0, "versions_seen": None}
"""Source metadata of a backfill event, where a kind's field is not a string."""


@lru_cache(maxsize=4096)
def _millis_text(when: datetime) -> str:
    """Every event of a batch shares its read time, and those of a transaction their source
    time: each is formatted once, and `strftime` runs once a minute (its date and time up to
    the minute), not once a transaction."""
    utc = when.astimezone(UTC)
    prefix = minute_text("%Y-%m-%dT%H:%M:", utc.year, utc.month, utc.day, utc.hour, utc.minute)
    return f"{prefix}{utc.second:02d}.{when.microsecond // 1000:03d}Z"


def _int_text(value: Any) -> Any:
    return None if value is None else str(value)


def _as_is(value: Any) -> Any:
    return value


def _encoder_of(column: ColumnTypeInfo) -> Callable[[Any], Any]:
    """`_json_value` for one column, with the common types' answer worked out once."""
    code = column.type.code
    if code == "INT64":
        return _int_text
    if code in ("STRING", "BOOL"):
        return _as_is
    return functools.partial(_json_value, column=column)


def _encoders_of(types: tuple[ColumnTypeInfo, ...]
                 ) -> tuple[tuple[str, Callable[[Any], Any]], ...]:
    return tuple((c.name, _encoder_of(c)) for c in types)


_payload_encoders: IdentityMemo[tuple[ColumnTypeInfo, ...],
                                tuple[tuple[str, Callable[[Any], Any]], ...]] = IdentityMemo(
    _encoders_of, size=256)
"""Per column-types tuple (one per table and schema, shared by its events)."""


def _json_value(value: Any, column: ColumnTypeInfo) -> Any:
    encoded = encode_value(value, column.type)
    if column.type.code == "INT64" and encoded is not None:
        return str(encoded)
    if column.type.code == "ARRAY" and column.type.element and column.type.element.code == "INT64":
        return [None if v is None else str(v) for v in encoded]
    return encoded


def schema_key(object_name: str, column_types: Iterable[ColumnTypeInfo]) -> str:
    """Identifies the unified schema: changes when a column, type or key changes."""
    types = tuple(column_types)
    known = _schema_keys(types)  # the events of a table share one tuple: found by identity
    key = known.get(object_name)
    if key is None:
        key = known[object_name] = _schema_key(object_name, types)
    return key


_schema_keys: IdentityMemo[tuple[ColumnTypeInfo, ...], dict[str, str]] = IdentityMemo(
    lambda _: {}, size=256)
"""Per column-types tuple: its schema key per object name."""


@lru_cache(maxsize=1024)
def _schema_key(object_name: str, column_types: tuple[ColumnTypeInfo, ...]) -> str:
    text = json.dumps([object_name, [c.to_dict() for c in column_types]], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@lru_cache(maxsize=1024)
def _column_types(text: str) -> tuple[ColumnTypeInfo, ...]:
    """The column types of a log row (the same text for every change of a table)."""
    return tuple(ColumnTypeInfo.from_dict(c) for c in json.loads(text))


def change_uuid(stream_name: str, *position: str | int) -> str:
    """`uuid.uuid5(_NAMESPACE, name)` as text, built from the SHA-1 digest directly (a
    third of the time: no UUID object, no integer formatting)."""
    name = "/".join([stream_name, *map(str, position)])
    digest = hashlib.sha1(_NAMESPACE_BYTES + name.encode()).hexdigest()
    variant = "89ab"[int(digest[16], 16) & 3]  # RFC 4122: the top bits of byte 8 are 10
    return (f"{digest[:8]}-{digest[8:12]}-5{digest[13:16]}-{variant}{digest[17:20]}-"
            f"{digest[20:32]}")


class Change(NamedTuple):
    """What an event says about one change besides its row: where it sits in the change log
    and where it came from (the source block, with the change's own position fields). A
    named tuple, as `Event`."""

    table: str
    mod_type: str
    column_types: tuple[ColumnTypeInfo, ...]
    commit_micros: int
    server_transaction_id: str
    record_sequence: str
    mod_index: int
    partition_token: str
    source: SourceMetadata
    position: dict[str, Any]

    @staticmethod
    def of_record(record: DataChangeRecord, mod_index: int, partition_token: str) -> Change:
        source = record.source_metadata
        return Change(record.table_name, record.mod_type, record.column_types,
                      to_micros(record.commit_timestamp), record.server_transaction_id,
                      record.record_sequence, mod_index, partition_token, source,
                      source.position | record.mods[mod_index].position)


def source_fields(kind: SourceKind, change: Change, database: str) -> dict[str, Any]:
    """EV-4 source metadata of a change for its kind of source: the kind's fields (a field
    of the change's position first, else the database, transaction id, record sequence or
    partition token, else None), its object's naming fields, change type, is_deleted and
    primary keys, in that order. What depends only on the kind, the table and the database
    is laid out once (`_fields_template`); a change fills in the rest."""
    template, filled = _fields_template(kind, change.table, change.column_types, database)
    fields = template.copy()
    position = change.position
    for name in filled:
        if name in position:
            fields[name] = position[name]
        elif name == "tx_id":
            fields[name] = change.source.tx_id
        elif name == "record_sequence":
            fields[name] = change.record_sequence
        elif name == "partition_token":
            fields[name] = change.partition_token
    fields["change_type"] = change_type(kind, change)
    fields["is_deleted"] = change.mod_type == "DELETE"
    fields["primary_keys"] = list(fields["primary_keys"])  # each event its own list
    return fields


FieldsTemplate = tuple[dict[str, Any], tuple[str, ...]]
"""Source metadata with every field a change does not decide filled in, and the names of the
kind's fields that a change decides (those its object's naming fields do not override)."""


def _fields_template(kind: SourceKind, table: str, column_types: tuple[ColumnTypeInfo, ...],
                     database: str) -> FieldsTemplate:
    templates = _templates(column_types)  # a table's events share one tuple: by identity
    template = templates.get((kind.name, table, database))
    if template is None:
        template = templates[(kind.name, table, database)] = _template_of(
            kind, table, column_types, database)
    return template


def _template_of(kind: SourceKind, table: str, column_types: tuple[ColumnTypeInfo, ...],
                 database: str) -> FieldsTemplate:
    naming = object_parts(kind, table)
    fields: dict[str, Any] = {name: database if name == "database" else None
                              for name in kind.fields}
    fields |= naming | {"change_type": None, "is_deleted": None,
                        "primary_keys": tuple(c.name for c in column_types if c.is_primary_key)}
    return fields, tuple(name for name in kind.fields if name not in naming)


_templates: IdentityMemo[tuple[ColumnTypeInfo, ...], dict[tuple[str, str, str],
                                                      FieldsTemplate]] = IdentityMemo(
    lambda _: {}, size=256)
"""Per column-types tuple: the template per kind, object name and database."""


def change_type(kind: SourceKind, change: Change) -> str:
    """EV-4's change_type: the mod type, except for MySQL, where an update is UPDATE-INSERT
    and one that moves the key is UPDATE-DELETE (the old key) then UPDATE-INSERT."""
    if kind.name != "mysql":
        return change.mod_type
    if change.mod_type == "UPDATE" or "moved_from" in change.position:
        return "UPDATE-INSERT"
    if "moved_to" in change.position:
        return "UPDATE-DELETE"
    return change.mod_type


def event_of_change(stream_name: str, database: str, change: Change, row: dict[str, Any],
                    read_timestamp: datetime) -> Event:
    """The event of one change; `row` is the whole new row (INSERT, UPDATE) or the deleted row
    (DELETE), as Python values (EV-5)."""
    kind = kind_of(change.source.read_method)
    context = ChangeContext(change.source, change.position, change.commit_micros,
                            change.server_transaction_id, change.record_sequence,
                            change.mod_index)
    backfilled = change.source.read_method == kind.backfill_method
    if backfilled:  # a row read again: the same uuid whenever the same request reads it
        keys = [c.name for c in change.column_types if c.is_primary_key]
        identity = change_uuid(stream_name, change.table, "backfill", change.source.tx_id,
                               json.dumps([row.get(k) for k in keys], default=str))
    else:
        identity = change_uuid(stream_name, change.table, change.server_transaction_id,
                               change.record_sequence, change.mod_index)
    return Event(
        stream_name=stream_name,
        read_method=change.source.read_method,
        object=change.table,
        schema_key=schema_key(change.table, change.column_types),
        uuid=identity,
        read_timestamp=read_timestamp,
        source_timestamp=change.source.source_timestamp,
        sort_keys=() if backfilled else kind.sort_keys(context),  # EV-6: no order there
        source_metadata=source_fields(kind, change, database),
        payload=dict(row),
        column_types=change.column_types,
    )


def event_from_mod(
    stream_name: str,
    database: str,
    record: DataChangeRecord,
    mod_index: int,
    row: dict[str, Any],
    read_timestamp: datetime,
    partition_token: str = "",
) -> Event:
    """The event of one mod of a record (see `event_of_change`)."""
    change = Change.of_record(record, mod_index, partition_token)
    return event_of_change(stream_name, database, change, row, read_timestamp)


def change_of_row(row: dict[str, Any]) -> Change:
    """The change of one row of the "cdcflow" source (a dict of its columns)."""
    stamp = row["commit_timestamp"]
    commit = stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)
    source, position = _source_of_row(row["read_method"], row["source_timestamp"],
                                      row["server_transaction_id"], row["source_metadata"])
    return Change(row["table_name"], row["mod_type"],
                  _column_types(row["column_types"]),
                  to_micros(commit), row["server_transaction_id"], row["record_sequence"],
                  int(row["mod_index"]), row["partition_token"], source, position)


@lru_cache(maxsize=4096)
def _source_of_row(read_method: str, source_stamp: datetime, server_transaction_id: str,
                   text: str) -> tuple[SourceMetadata, dict[str, Any]]:
    """The source block of a row and its position fields; the rows of one transaction share
    them (read-only), unless each change has its own position (an LSN per change)."""
    if source_stamp.tzinfo is None:
        source_stamp = source_stamp.replace(tzinfo=UTC)
    position = orjson.loads(text)
    tx_id = str(position.pop("tx_id", server_transaction_id))
    return SourceMetadata(read_method, source_stamp, tx_id, position), position


def backfill_event(
    stream_name: str,
    database: str,
    table: str,
    column_types: tuple[ColumnTypeInfo, ...],
    row: dict[str, Any],
    snapshot: datetime,
    read_timestamp: datetime,
    kind: SourceKind = EMBEDDED,
) -> Event:
    """A backfill event: the row as of the snapshot; no order among backfill events (EV-6)."""
    keys = [c.name for c in column_types if c.is_primary_key]
    identity = [c for c in column_types if c.is_primary_key] or list(column_types)
    key_text = json.dumps([encode_value(row[c.name], c.type) for c in identity])  # no key:
    # the whole row, so that a row read twice (a resumed backfill) keeps its uuid (EV-7)
    metadata: dict[str, Any] = {name: _BACKFILL_DEFAULTS.get(name, "")
                                for name in kind.fields}
    metadata |= {"database": database} if "database" in kind.fields else {}
    metadata |= object_parts(kind, table) | {
        "change_type": "INSERT", "is_deleted": False, "primary_keys": keys}
    return Event(
        stream_name=stream_name,
        read_method=kind.backfill_method,
        object=table,
        schema_key=schema_key(table, column_types),
        uuid=change_uuid(stream_name, table, "backfill", to_micros(snapshot), key_text),
        read_timestamp=read_timestamp,
        source_timestamp=snapshot,
        sort_keys=(),
        source_metadata=metadata,
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
