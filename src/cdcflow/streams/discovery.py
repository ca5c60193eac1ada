"""Discovery (EV-10): the objects of a source and each object's fields with their metadata."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cdcflow.capture.embedded import source_object
from cdcflow.store.database import Database
from cdcflow.streams.definition import StreamDefinition
from cdcflow.streams.sources import open_source


def discover_embedded(database: str) -> list[dict[str, Any]]:
    """Every table of an embedded database with its fields: name, type, key position,
    nullability, ordinal position."""
    db = Database.open(database, create=False)
    return [source_object(db.table_schema(table)).describe() for table in db.tables()]


def discover_definition(definition: StreamDefinition, home: str | Path) -> list[dict[str, Any]]:
    """The objects a stream definition's source offers (all of them, selected or not)."""
    source = open_source(definition, home)
    try:
        return [item.describe() for item in source.discover()]
    finally:
        source.close()
