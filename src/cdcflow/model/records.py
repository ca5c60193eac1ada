"""Change records (CS-6..CS-9): data change, heartbeat and child-partitions records.

Records hold values in the JSON value encoding of `cdcflow.model.types`; `column_types`
says how to decode them. `to_dict()` gives the seed's JSON shape; `from_dict()` reads it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cdcflow.errors import InvalidArgument
from cdcflow.model.source import SourceMetadata, embedded_source
from cdcflow.model.timestamps import format_rfc3339, parse_timestamp
from cdcflow.model.types import ColumnType, decode_value

MOD_TYPES = ("INSERT", "UPDATE", "DELETE")


def format_sequence(number: int) -> str:
    """record_sequence text: zero-padded to 8 digits (longer when needed), sorts as a number."""
    return f"{number:08d}"


@dataclass(frozen=True, slots=True)
class ColumnTypeInfo:
    """CS-7 column_types entry; ordinal_position starts at 1."""

    name: str
    type: ColumnType
    is_primary_key: bool
    ordinal_position: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type.to_json(),
            "is_primary_key": self.is_primary_key,
            "ordinal_position": self.ordinal_position,
        }

    @staticmethod
    def from_dict(data: dict[str, Any]) -> ColumnTypeInfo:
        return ColumnTypeInfo(
            data["name"],
            ColumnType.from_json(data["type"]),
            data["is_primary_key"],
            data["ordinal_position"],
        )


@dataclass(frozen=True, slots=True)
class Mod:
    """One changed row: primary key values, and non-key new/old values (JSON-encoded).

    `position` holds the source position fields of this change alone (e.g. its LSN); native
    commits leave it empty, and then it is left out of `to_dict()`."""

    keys: dict[str, Any]
    new_values: dict[str, Any]
    old_values: dict[str, Any]
    position: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "keys": self.keys, "new_values": self.new_values, "old_values": self.old_values
        }
        if self.position:
            out["position"] = self.position
        return out

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Mod:
        return Mod(data["keys"], data.get("new_values") or {}, data.get("old_values") or {},
                   data.get("position") or {})


@dataclass(frozen=True, slots=True)
class DataChangeRecord:
    """CS-7: the mods of one transaction, one table, one mod_type, in one partition."""

    commit_timestamp: datetime
    record_sequence: str
    server_transaction_id: str
    is_last_record_in_transaction_in_partition: bool
    table_name: str
    column_types: tuple[ColumnTypeInfo, ...]
    mods: tuple[Mod, ...]
    mod_type: str
    value_capture_type: str
    number_of_records_in_transaction: int
    number_of_partitions_in_transaction: int
    source: SourceMetadata | None = None

    @property
    def source_metadata(self) -> SourceMetadata:
        """The record's source block; a native commit's is derived from the record (EV-3)."""
        if self.source is not None:
            return self.source
        return embedded_source(self.commit_timestamp, self.server_transaction_id)

    def to_dict(self) -> dict[str, Any]:
        """The seed's shape (CS-7); a record appended from an external source adds `source`."""
        out: dict[str, Any] = {
            "commit_timestamp": format_rfc3339(self.commit_timestamp),
            "record_sequence": self.record_sequence,
            "server_transaction_id": self.server_transaction_id,
            "is_last_record_in_transaction_in_partition": (
                self.is_last_record_in_transaction_in_partition
            ),
            "table_name": self.table_name,
            "column_types": [c.to_dict() for c in self.column_types],
            "mods": [m.to_dict() for m in self.mods],
            "mod_type": self.mod_type,
            "value_capture_type": self.value_capture_type,
            "number_of_records_in_transaction": self.number_of_records_in_transaction,
            "number_of_partitions_in_transaction": self.number_of_partitions_in_transaction,
        }
        if self.source is not None:
            out["source"] = self.source.to_dict()
        return out

    @staticmethod
    def from_dict(data: dict[str, Any]) -> DataChangeRecord:
        source = data.get("source")
        return DataChangeRecord(
            commit_timestamp=parse_timestamp(data["commit_timestamp"]),
            record_sequence=data["record_sequence"],
            server_transaction_id=data["server_transaction_id"],
            is_last_record_in_transaction_in_partition=data[
                "is_last_record_in_transaction_in_partition"
            ],
            table_name=data["table_name"],
            column_types=tuple(ColumnTypeInfo.from_dict(c) for c in data["column_types"]),
            mods=tuple(Mod.from_dict(m) for m in data["mods"]),
            mod_type=data["mod_type"],
            value_capture_type=data["value_capture_type"],
            number_of_records_in_transaction=data["number_of_records_in_transaction"],
            number_of_partitions_in_transaction=data["number_of_partitions_in_transaction"],
            source=None if source is None else SourceMetadata.from_dict(source),
        )

    def column_type(self, name: str) -> ColumnType:
        for info in self.column_types:
            if info.name == name:
                return info.type
        raise InvalidArgument(f"column {name!r} is not in this record's column_types")

    def decoded_mods(self) -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
        """(keys, new_values, old_values) of every mod, decoded to Python values."""

        def decode(values: dict[str, Any]) -> dict[str, Any]:
            return {k: decode_value(v, self.column_type(k)) for k, v in values.items()}

        return [(decode(m.keys), decode(m.new_values), decode(m.old_values)) for m in self.mods]


@dataclass(frozen=True, slots=True)
class HeartbeatRecord:
    """CS-8: every record of the partition with commit_timestamp <= timestamp has been returned."""

    timestamp: datetime

    def to_dict(self) -> dict[str, Any]:
        return {"timestamp": format_rfc3339(self.timestamp)}


@dataclass(frozen=True, slots=True)
class ChildPartition:
    """A child partition token and the tokens of its parents (empty for initial partitions)."""

    token: str
    parent_partition_tokens: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"token": self.token, "parent_partition_tokens": list(self.parent_partition_tokens)}


@dataclass(frozen=True, slots=True)
class ChildPartitionsRecord:
    """CS-9: partitions that hold the records from start_timestamp on."""

    start_timestamp: datetime
    record_sequence: str
    child_partitions: tuple[ChildPartition, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "start_timestamp": format_rfc3339(self.start_timestamp),
            "record_sequence": self.record_sequence,
            "child_partitions": [c.to_dict() for c in self.child_partitions],
        }


@dataclass(frozen=True, slots=True)
class ChangeRecord:
    """CS-6: one row of a change-stream query; exactly one of the three fields is set."""

    data_change_record: DataChangeRecord | None = None
    heartbeat_record: HeartbeatRecord | None = None
    child_partitions_record: ChildPartitionsRecord | None = None

    def __post_init__(self) -> None:
        set_fields = [
            f
            for f in (self.data_change_record, self.heartbeat_record, self.child_partitions_record)
            if f is not None
        ]
        if len(set_fields) != 1:
            raise InvalidArgument(
                f"a ChangeRecord holds exactly one record, got {len(set_fields)} (CS-6)"
            )

    @property
    def timestamp(self) -> datetime:
        """The time up to which this record proves progress in its partition."""
        if self.data_change_record is not None:
            return self.data_change_record.commit_timestamp
        if self.heartbeat_record is not None:
            return self.heartbeat_record.timestamp
        assert self.child_partitions_record is not None
        return self.child_partitions_record.start_timestamp

    def to_dict(self) -> dict[str, list[dict[str, Any]]]:
        """Spanner's shape: each field an array of zero or one struct."""

        def wrap(record: Any) -> list[dict[str, Any]]:
            return [] if record is None else [record.to_dict()]

        return {
            "data_change_record": wrap(self.data_change_record),
            "heartbeat_record": wrap(self.heartbeat_record),
            "child_partitions_record": wrap(self.child_partitions_record),
        }
