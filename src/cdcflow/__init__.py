"""cdcflow: change data capture for Python, with its pipeline on Apache Spark (PySpark)."""

from cdcflow.clock import Clock, FakeClock, SystemClock
from cdcflow.model.partitions import PartitionMetadata, PartitionPolicy
from cdcflow.model.records import (
    ChangeRecord,
    ChildPartition,
    ChildPartitionsRecord,
    DataChangeRecord,
    HeartbeatRecord,
    Mod,
)
from cdcflow.model.types import COMMIT_TIMESTAMP
from cdcflow.store.database import Database

__all__ = [
    "COMMIT_TIMESTAMP",
    "ChangeRecord",
    "ChildPartition",
    "ChildPartitionsRecord",
    "Clock",
    "DataChangeRecord",
    "Database",
    "FakeClock",
    "HeartbeatRecord",
    "Mod",
    "PartitionMetadata",
    "PartitionPolicy",
    "SystemClock",
]
__version__ = "0.1.0"
