"""Discovery (EV-10): the objects of a source and each object's fields with their metadata."""

from __future__ import annotations

from typing import Any

from cdcflow.store.database import Database


def discover_embedded(database: str) -> list[dict[str, Any]]:
    """Tables of an embedded database with fields: name, type, key position, nullability."""
    db = Database.open(database, create=False)
    objects = []
    for table in db.tables():
        schema = db.table_schema(table)
        fields = [{
            "name": column.name,
            "type": column.type.ddl(),
            "primary_key_position": (schema.primary_key.index(column.name) + 1
                                     if column.name in schema.primary_key else None),
            "nullable": not column.not_null,
            "ordinal_position": schema.ordinal(column.name),
        } for column in schema.columns]
        objects.append({"object": table, "primary_key": list(schema.primary_key),
                        "fields": fields})
    return objects
