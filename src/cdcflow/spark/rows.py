"""Rows of the "cdcflow" source back to change records."""

from __future__ import annotations

import json
from datetime import UTC
from typing import Any

from cdcflow.model.records import DataChangeRecord
from cdcflow.model.source import EMBEDDED
from cdcflow.model.timestamps import format_rfc3339, parse_timestamp


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
