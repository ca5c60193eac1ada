"""CDC tables on Delta Lake: UPSERT/DELETE with sequence numbers, max_staleness, apply
watermark, runtime merge and delete tombstones (AP-1..AP-10)."""

from cdcflow.model.sequence import ChangeSequenceNumber
from cdcflow.table.cdc_table import CdcTable, Connection

__all__ = ["CdcTable", "ChangeSequenceNumber", "Connection"]
