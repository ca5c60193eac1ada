"""The source side of a stream, for `cdcflow status`: every few seconds a RUNNING or PAUSED
stream's source says what it holds for the stream (a slot's retained WAL), and a paused
stream whose slot holds more than the source's threshold is warned about. The embedded
database keeps nothing for a stream: it is not asked."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdcflow.errors import CdcflowError
from cdcflow.streams.catalog import Catalog, StreamRecord
from cdcflow.streams.definition import EmbeddedSource
from cdcflow.streams.sources import open_source
from cdcflow.streams.states import StreamState

SOURCE_STATUS_SECONDS = 5.0


@dataclass
class SourceWatch:
    """One stream's source status, looked at by the runner's loop."""

    catalog: Catalog
    home: Path
    at: float = float("-inf")
    warned: bool = False
    opened: Any = None
    """The source opened for its status while the stream has no setup (paused)."""

    def look(self, record: StreamRecord, setup: Any, now: float) -> None:
        """If it is time: the source's status into the catalog, and the warning if due.
        `setup` is the stream's StreamSetup while it runs (its source is used), else None."""
        if isinstance(record.definition.source, EmbeddedSource) or \
                now < self.at + SOURCE_STATUS_SECONDS:
            return
        self.at = now
        name = record.definition.name
        try:
            if setup is None and self.opened is None:
                self.opened = open_source(record.definition, self.home)
            found = (setup.source if setup is not None else self.opened).status()
        except CdcflowError as error:  # the source is away: say so, keep the state
            self.catalog.update_status(name, source={"error": str(error)})
            return
        warnings = []
        held, limit = found.get("retained_wal_bytes") or 0, found.get("warn_above")
        if record.state == StreamState.PAUSED and limit is not None and held > limit:
            warnings.append(f"the paused stream's slot holds {held / 2**20:.0f} MB of WAL, "
                            f"more than {limit / 2**20:.0f} MB: resume, drain or delete it")
            if not self.warned:
                self.catalog.record_error(name, "*", warnings[0])
        self.warned = bool(warnings)
        self.catalog.update_status(name, source=found, warnings=warnings)
