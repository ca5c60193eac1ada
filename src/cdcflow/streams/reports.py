"""What a runner's helpers report about a stream (the applier, a capture worker's death, a
query that would not stop), written for the creation of the stream their work was started
for: nothing is written for a stream deleted, and perhaps created again under its name,
while the work was in flight (`Catalog.scoped`)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from typing import Any

from cdcflow.spark.failure_text import MESSAGE_LIMIT, described
from cdcflow.streams.catalog import Catalog, StreamGone


class ScopedReports:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def write(self, name: str, creation: str | None, write: Callable[[Catalog], None]) -> None:
        """`write(catalog)` through this catalog scoped to one creation of stream `name`."""
        with suppress(StreamGone):
            write(self.catalog.scoped(name, creation))

    def error(self, name: str, creation: str | None, object_name: str, message: str) -> None:
        self.write(name, creation, lambda c: c.record_error(name, object_name, message))

    def tables(self, stream: str, status: dict[str, Any], creation: str | None) -> None:
        """The applier's status of the stream's tables."""
        self.write(stream, creation, lambda c: c.update_status(stream, **status))

    def table_failed(self, stream: str, table: str, error: BaseException,
                     creation: str | None, job: str = "apply") -> None:
        prefix = f"{job} failed: "
        self.error(stream, creation, table, prefix + described(error, MESSAGE_LIMIT - len(prefix)))

    def capture_died(self, stream: str, message: str, creation: str | None) -> None:
        self.error(stream, creation, "*", message)
