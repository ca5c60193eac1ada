"""Sources into the change log: the `ChangeSource` protocol and its implementations."""

from cdcflow.capture.source import ChangeSource, Snapshot, SourceColumn, SourceObject

__all__ = ["ChangeSource", "Snapshot", "SourceColumn", "SourceObject"]
