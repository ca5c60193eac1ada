"""Row layouts the "cdcflow" source produces, as Spark DDL and as Arrow schemas.

Change rows carry one mod each. Their key and values are JSON strings (the record's Spanner
JSON encoding) with `column_types` beside them, because one stream spans tables of different
schemas (FOR ALL) and schemas evolve (ADD COLUMN): no fixed typed schema can hold them all.
Then comes the change's source block: `read_method`, `source_timestamp`, and `source_metadata`
(JSON of `tx_id` and the source's position fields, e.g. an LSN). Table snapshots, which read
one table, keep their column types.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from cdcflow.model.schema import TableSchema
from cdcflow.model.types import ColumnType
from cdcflow.table.arrow_types import arrow_type

CHANGE_COLUMNS: list[tuple[str, str, Any]] = [
    ("commit_timestamp", "TIMESTAMP", pa.timestamp("us", tz="UTC")),
    ("server_transaction_id", "STRING", pa.string()),
    ("record_sequence", "STRING", pa.string()),
    ("mod_index", "INT", pa.int32()),
    ("table_name", "STRING", pa.string()),
    ("mod_type", "STRING", pa.string()),
    ("value_capture_type", "STRING", pa.string()),
    ("number_of_records_in_transaction", "BIGINT", pa.int64()),
    ("number_of_partitions_in_transaction", "BIGINT", pa.int64()),
    ("is_last_record_in_transaction_in_partition", "BOOLEAN", pa.bool_()),
    ("partition_token", "STRING", pa.string()),
    ("keys", "STRING", pa.string()),
    ("new_values", "STRING", pa.string()),
    ("old_values", "STRING", pa.string()),
    ("column_types", "STRING", pa.string()),
    ("read_method", "STRING", pa.string()),
    ("source_timestamp", "TIMESTAMP", pa.timestamp("us", tz="UTC")),
    ("source_metadata", "STRING", pa.string()),
]
RAW_COLUMNS: list[tuple[str, str, Any]] = [
    ("partition_token", "STRING", pa.string()),
    ("record_type", "STRING", pa.string()),
    ("timestamp", "TIMESTAMP", pa.timestamp("us", tz="UTC")),
    ("record", "STRING", pa.string()),
]


def ddl_of(columns: list[tuple[str, str, Any]]) -> str:
    return ", ".join(f"{name} {sql}" for name, sql, _ in columns)


def arrow_of(columns: list[tuple[str, str, Any]]) -> pa.Schema:
    return pa.schema([(name, arrow) for name, _, arrow in columns])


def _spark_type(ctype: ColumnType) -> str:
    match ctype.code:
        case "ARRAY":
            assert ctype.element is not None
            return f"ARRAY<{_spark_type(ctype.element)}>"
        case "INT64":
            return "BIGINT"
        case "FLOAT64":
            return "DOUBLE"
        case "BOOL":
            return "BOOLEAN"
        case "BYTES":
            return "BINARY"
        case "NUMERIC":
            integer, scale = ctype.numeric_digits
            return f"DECIMAL({integer + scale},{scale})"
        case "STRING" | "JSON":
            return "STRING"
        case _:
            return ctype.code


def table_columns(schema: TableSchema) -> list[tuple[str, str, Any]]:
    """Typed Spark/Arrow columns of a table, in schema order."""
    return [(c.name, _spark_type(c.type), arrow_type(c.type)) for c in schema.columns]
