"""Delta commits written by cdcflow itself, for what deltalake's Python API cannot express:
add and remove actions that carry a deletion vector, and the protocol upgrade that enables
them. A commit is one JSON file, `_delta_log/<version>.json`, made visible atomically with a
hard link that fails if another writer took the version first (put-if-absent, as delta-rs
does on a local filesystem).
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from cdcflow.errors import FailedPrecondition
from cdcflow.table.deletion_vectors import DeletionVector

EXPIRED_LOG_CLEANUP = "delta.enableExpiredLogCleanup"
"""The Delta table property that lets a commit remove log entries past their retention."""

FEATURE = "deletionVectors"
ENGINE = "cdcflow"


@dataclass(frozen=True, slots=True)
class FileAction:
    """One data file of the table, as an add or a remove names it."""

    path: str
    size: int
    rows: int
    vector: DeletionVector | None = None

    def add(self, now_ms: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "path": self.path, "partitionValues": {}, "size": self.size,
            "modificationTime": now_ms, "dataChange": True,
            "stats": json.dumps({"numRecords": self.rows}),
        }
        if self.vector is not None:
            body["deletionVector"] = self.vector.to_json()
        return {"add": body}

    def remove(self, now_ms: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "path": self.path, "deletionTimestamp": now_ms, "dataChange": True,
            "extendedFileMetadata": True, "partitionValues": {}, "size": self.size,
        }
        if self.vector is not None:
            body["deletionVector"] = self.vector.to_json()
        return {"remove": body}


def supports_vectors(table: DeltaTable) -> bool:
    protocol = table.protocol()
    return FEATURE in (protocol.reader_features or []) and FEATURE in (
        protocol.writer_features or [])


def upgrade_actions(table: DeltaTable) -> list[dict[str, Any]]:
    """The protocol and metadata actions that enable deletion vectors (none if enabled).
    Writer version 7 lists its features by name, so those the old version implied stay."""
    if supports_vectors(table):
        return []
    protocol = table.protocol()
    writer = set(protocol.writer_features or [])
    if protocol.min_writer_version >= 2:
        writer |= {"appendOnly", "invariants"}
    reader = set(protocol.reader_features or [])
    metadata = table.metadata()
    configuration = dict(metadata.configuration) | {"delta.enableDeletionVectors": "true"}
    return [
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                      "readerFeatures": sorted(reader | {FEATURE}),
                      "writerFeatures": sorted(writer | {FEATURE})}},
        {"metaData": {"id": metadata.id, "name": metadata.name,
                      "description": metadata.description,
                      "format": {"provider": "parquet", "options": {}},
                      "schemaString": table.schema().to_json(),
                      "partitionColumns": list(metadata.partition_columns),
                      "createdTime": metadata.created_time, "configuration": configuration}},
    ]


def commit(root: Path, table: DeltaTable, actions: list[dict[str, Any]],
           commit_info: dict[str, str], now_ms: int) -> int:
    """Write `actions` as the version after `table`'s; return that version. Fails with
    FailedPrecondition, writing nothing, if another writer committed that version first."""
    version = table.version() + 1
    info = {"timestamp": now_ms, "operation": "WRITE", "operationParameters": {
        "mode": "Append"}, "engineInfo": ENGINE} | commit_info
    lines = [json.dumps({"commitInfo": info})] + [json.dumps(a) for a in actions]
    folder = root / "_delta_log"
    temporary = folder / f".{uuid.uuid4().hex}.json.tmp"
    temporary.write_text("\n".join(lines) + "\n")
    try:  # no fsync, like delta-rs's own commits and the data files they name
        os.link(temporary, folder / f"{version:020d}.json")
    except FileExistsError:
        raise FailedPrecondition(
            f"Delta version {version} of {root} was committed by another writer first"
        ) from None
    finally:
        temporary.unlink(missing_ok=True)
    return version
