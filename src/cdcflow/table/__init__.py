"""CDC tables on Delta Lake: UPSERT/DELETE with sequence numbers, max_staleness, apply
watermark, runtime merge and delete tombstones (AP-1..AP-10).

The exports load lazily: a Spark worker that needs only `cdcflow.table.arrow_types` (the
source's column types) does not import Delta Lake (about 0.2 s in every new worker process).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cdcflow.model.sequence import ChangeSequenceNumber
    from cdcflow.table.cdc_table import CdcTable
    from cdcflow.table.connection import Connection

_EXPORTS = {
    "CdcTable": "cdcflow.table.cdc_table",
    "Connection": "cdcflow.table.connection",
    "ChangeSequenceNumber": "cdcflow.model.sequence",
}
__all__ = ["CdcTable", "ChangeSequenceNumber", "Connection"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'cdcflow.table' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
