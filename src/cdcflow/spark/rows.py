"""Rows of the "cdcflow" source as Python: dicts of a record batch, and change records."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from cdcflow.model.records import DataChangeRecord
from cdcflow.model.source import EMBEDDED
from cdcflow.model.timestamps import format_rfc3339, parse_timestamp

_EPOCHS = {"UTC": datetime(1970, 1, 1, tzinfo=UTC),
           None: datetime(1970, 1, 1, tzinfo=UTC).replace(tzinfo=None)}
"""The epoch of timestamps in UTC and without zone. pyarrow's `to_pylist` gives UTC as
`ZoneInfo("UTC")`; cdcflow's `datetime.UTC` is the same instant and half the cost wherever the
pipeline subtracts, compares or hashes its datetimes."""


def batch_dicts(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """The rows of `batch` as dicts, equal to `batch.to_pylist()`. Microsecond timestamps
    (UTC or without zone) are made once per distinct value, UTC ones in `datetime.UTC`: the
    mods of one transaction share theirs, and pyarrow's conversion of each took two thirds of
    the whole."""
    names = batch.schema.names
    columns = [_timestamps(column, field.type) if pa.types.is_timestamp(field.type)
               else column.to_pylist() for field, column in zip(batch.schema, batch.columns,
                                                               strict=True)]
    return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]


def row_dicts(rows: Iterable[tuple[Any, ...]], columns: list[tuple[str, str, Any]]
              ) -> list[dict[str, Any]]:
    """Rows in `columns` order with timestamps (UTC) in micros, as `batch_dicts` gives them
    from a record batch of the same rows: each distinct timestamp made once."""
    names = [name for name, _, _ in columns]
    stamps = [index for index, (_, kind, _) in enumerate(columns) if kind == "TIMESTAMP"]
    epoch = _EPOCHS["UTC"]
    made: dict[int, datetime] = {}
    out = []
    for row in rows:
        values = list(row)
        for index in stamps:
            micros = values[index]
            if micros is not None:
                stamp = made.get(micros)
                if stamp is None:
                    stamp = made[micros] = epoch + timedelta(microseconds=micros)
                values[index] = stamp
        out.append(dict(zip(names, values, strict=True)))
    return out


def _timestamps(column: pa.Array, kind: pa.TimestampType) -> list[datetime | None]:
    epoch = _EPOCHS.get(kind.tz) if kind.unit == "us" else None
    if epoch is None:  # another unit or zone: as pyarrow converts it
        return list(column.to_pylist())
    made: dict[int, datetime] = {}
    out: list[datetime | None] = []
    for micros in column.view(pa.int64()).to_pylist():
        if micros is None:
            out.append(None)
            continue
        stamp = made.get(micros)
        if stamp is None:
            stamp = made[micros] = epoch + timedelta(microseconds=micros)
        out.append(stamp)
    return out


def _source_block(data: dict[str, Any]) -> dict[str, Any]:
    """The record's `source` entry; none for a native commit of the embedded database."""
    if data.get("read_method", EMBEDDED.cdc_method) == EMBEDDED.cdc_method:
        return {}
    stamp = data["source_timestamp"]
    stamp = stamp if isinstance(stamp, str) else format_rfc3339(
        stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC))
    position = json.loads(data["source_metadata"])
    tx_id = position.pop("tx_id", "")
    return {"source": {"read_method": data["read_method"], "source_timestamp": stamp,
                       "tx_id": tx_id, "position": position}}


def record_from_row(data: dict[str, Any]) -> DataChangeRecord:
    """A single-mod record from one row (a dict) of the "cdcflow" source."""
    stamp = data["commit_timestamp"]
    if isinstance(stamp, str):
        stamp = parse_timestamp(stamp)
    elif stamp.tzinfo is None:  # Spark's collect() gives naive datetimes
        stamp = stamp.replace(tzinfo=UTC)
    return DataChangeRecord.from_dict({
        "commit_timestamp": format_rfc3339(stamp),
        "record_sequence": data["record_sequence"],
        "server_transaction_id": data["server_transaction_id"],
        "is_last_record_in_transaction_in_partition":
            data["is_last_record_in_transaction_in_partition"],
        "table_name": data["table_name"],
        "column_types": json.loads(data["column_types"]),
        "mods": [{"keys": json.loads(data["keys"]), "new_values": json.loads(data["new_values"]),
                  "old_values": json.loads(data["old_values"])}],
        **_source_block(data),
        "mod_type": data["mod_type"],
        "value_capture_type": data["value_capture_type"],
        "number_of_records_in_transaction": data["number_of_records_in_transaction"],
        "number_of_partitions_in_transaction": data["number_of_partitions_in_transaction"],
    })
