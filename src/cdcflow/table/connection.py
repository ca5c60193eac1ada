"""A writer's connection to a CDC table (AP-3): the rows it appends go to the table's
pending changes, and one connection carries either UPSERT/DELETE rows or plain rows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cdcflow.errors import InvalidArgument
from cdcflow.table import pending

if TYPE_CHECKING:
    from cdcflow.table.cdc_table import CdcTable


class Connection:
    """One writer connection (AP-3): it carries either UPSERT/DELETE rows or plain rows."""

    def __init__(self, table: CdcTable) -> None:
        self.table = table
        self.mode: str | None = None

    def append(self, rows: Any, app_id: str | None = None,
               version: int | None = None) -> bool:
        """Append changes (a pyarrow Table, a list of dicts or a pandas DataFrame). With
        `app_id` and `version`, an append already committed is skipped and False is returned.
        A bad value fails with InvalidArgument naming the row and the column; nothing of the
        append is kept. Spark DataFrames go through `cdcflow.spark.append_frame`."""
        if hasattr(rows, "mapInArrow"):
            raise InvalidArgument("append a Spark DataFrame with cdcflow.spark.append_frame("
                                  "connection, frame, ...): its executors write the files")
        data = pending.as_arrow(rows, self.table.schema)
        types = (data.column(pending.CHANGE_TYPE).to_pylist()
                 if pending.CHANGE_TYPE in data.column_names else [None] * data.num_rows)
        mode = pending.change_mode(types) if types else self.mode
        self.check_mode(mode, types[0] if types else None)
        prepared = pending.prepare(data, self.table.schema, self.table.primary_key,
                                   pending.ingest_stamp(self.table.clock))
        written = pending.append(self.table.root, prepared, app_id, version,
                                 self.table.clock)
        self.mode = mode
        return written

    def check_mode(self, mode: str | None, offender: Any) -> None:
        """AP-3 across the appends of one connection."""
        if self.mode is not None and mode is not None and mode != self.mode:
            raise InvalidArgument(
                f"{pending.INVALID_CHANGE_TYPE}: {offender!r} on a connection that carries "
                f"{'UPSERT/DELETE' if self.mode == 'cdc' else 'INSERT or untyped'} rows (AP-3)"
            )
