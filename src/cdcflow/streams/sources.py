"""From a stream definition's source profile to its `ChangeSource`."""

from __future__ import annotations

from pathlib import Path

from cdcflow.capture.embedded import EmbeddedSource as EmbeddedChangeSource
from cdcflow.capture.source import ChangeSource
from cdcflow.streams.definition import EmbeddedSource, StreamDefinition


def open_source(definition: StreamDefinition, home: str | Path) -> ChangeSource:
    """The source of a stream; `home` is the catalog's folder, where external sources keep
    their change logs (`<home>/logs/<stream>.db`)."""
    match definition.source:
        case EmbeddedSource(database=database, change_stream=change_stream):
            return EmbeddedChangeSource(database, change_stream)
    raise AssertionError(f"unhandled source {definition.source!r}")
