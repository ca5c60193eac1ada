"""A partitioned update of the embedded database (Spanner's Partitioned DML, CW-6): set some
columns of every row whose `column` is before a cutoff, in bounded batches, each batch its
own transaction.

The candidate keys come from one snapshot scan; each batch then reads its rows again and
writes only those still before the cutoff, so the update is idempotent and a batch cut short
can be run again. Between that read and the batch's commit another writer may still change a
row, and the update then overwrites the change's `column` value: this is CW-6's caveat, and
why a cleanup must only touch rows that no other writer updates at the same time.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from cdcflow.errors import InvalidArgument
from cdcflow.model.schema import TableSchema


class _Writable(Protocol):
    def table_schema(self, table: str) -> TableSchema: ...

    def scan(self, table: str) -> list[dict[str, Any]]: ...

    def read_row(self, table: str, key: Any) -> dict[str, Any] | None: ...

    def transaction(self) -> Any: ...


def partitioned_update(database: _Writable, table: str, values: dict[str, Any], column: str,
                       before: datetime, batch_rows: int = 1_000) -> int:
    """Set `values` on every row of `table` whose `column` < `before`; return how many rows
    changed. Each batch of at most `batch_rows` rows is one transaction."""
    schema = database.table_schema(table)
    if schema.column(column).type.code != "TIMESTAMP":
        raise InvalidArgument(f"partitioned update of {table!r}: column {column!r} is "
                              f"{schema.column(column).type.code}, not a TIMESTAMP")
    if not 1 <= batch_rows <= 100_000:
        raise InvalidArgument(f"batch_rows {batch_rows} must be 1..100000")
    if set(values) & set(schema.primary_key):
        raise InvalidArgument(f"partitioned update of {table!r} cannot set key columns "
                              f"{sorted(set(values) & set(schema.primary_key))}")
    keys = [schema.key_of(row) for row in database.scan(table)
            if row.get(column) is not None and row[column] < before]
    changed = 0
    for start in range(0, len(keys), batch_rows):
        changed += _batch(database, schema, keys[start:start + batch_rows], values, column,
                          before)
    return changed


def _batch(database: _Writable, schema: TableSchema, keys: list[tuple[Any, ...]],
           values: dict[str, Any], column: str, before: datetime) -> int:
    written = 0
    with database.transaction() as tx:
        for key in keys:
            row = database.read_row(schema.name, key)
            if row is None or row.get(column) is None or not row[column] < before:
                continue  # changed since the scan: it is no longer the update's
            tx.update(schema.name, dict(zip(schema.primary_key, key, strict=True)) | values)
            written += 1
    return written
