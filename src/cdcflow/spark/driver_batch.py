"""Small micro-batches read on the driver, without a Spark job (issue 11: latency).

A Spark job costs about 50 ms here and a read through the Python data source about 100 ms,
more than folding and writing a batch of a few hundred mods. A batch is fully defined by its
two offsets, which Spark writes to the checkpoint's offset log before it runs the batch:
`offsets/<id - 1>` ends where batch `id` starts, `offsets/<id>` is where it ends. The driver
reads the same slices the executors would (`change_slices`, `read_changes`), so the records are the
same; when an offset is not there (the first batch of a checkpoint, or a log Spark has
purged) or the batch holds more than the limit, the caller reads the frame through Spark.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pyarrow as pa

from cdcflow.model.timestamps import from_micros
from cdcflow.spark.offsets import StreamOffset
from cdcflow.spark.options import SourceOptions
from cdcflow.spark.reading import ChangeSlice, change_slices, read_changes
from cdcflow.store.changelog import open_log

OFFSET_LOG_VERSION = "v1"


def _offset_log_entry(checkpoint: str | Path, batch_id: int) -> list[str] | None:
    """The lines of batch `batch_id`'s entry in Spark's offset log (version, metadata, one
    source's offset), or None when there is none in the format this reads."""
    path = Path(checkpoint) / "offsets" / str(batch_id)
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return None
    if len(lines) != 3 or lines[0] != OFFSET_LOG_VERSION:
        return None  # one source per query: version, metadata, the source's offset
    return lines


def logged_offset(checkpoint: str | Path, batch_id: int) -> StreamOffset | None:
    """The source's end offset of batch `batch_id` in Spark's offset log, or None when the
    log does not hold it (or holds another source's, or another format's)."""
    lines = _offset_log_entry(checkpoint, batch_id)
    if lines is None:
        return None
    try:
        return StreamOffset.from_dict(json.loads(lines[2]))
    except (ValueError, KeyError, TypeError):
        return None


def logged_batch_time(checkpoint: str | Path, batch_id: int) -> datetime | None:
    """When Spark planned batch `batch_id` (`batchTimestampMs` in its offset log entry), or
    None when the log does not hold it. A restarted query runs a planned batch again with
    the entry it logged, so every attempt at the batch sees the same time."""
    lines = _offset_log_entry(checkpoint, batch_id)
    if lines is None:
        return None
    try:
        millis = json.loads(lines[1])["batchTimestampMs"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(millis, int) or isinstance(millis, bool) or millis <= 0:
        return None
    return from_micros(millis * 1000)


@dataclass(frozen=True, slots=True)
class DriverReader:
    """Reads a batch of a query's change stream on the driver, up to `limit` mods."""

    checkpoint: str
    options: SourceOptions
    limit: int

    def slices(self, batch_id: int) -> list[ChangeSlice] | None:
        """The slices of the batch's partitions (the same ones Spark's source plans), or None
        when the offset log does not say where the batch starts and ends."""
        if batch_id < 1 or self.options.stream is None:
            return None
        begin = logged_offset(self.checkpoint, batch_id - 1)
        end = logged_offset(self.checkpoint, batch_id)
        if begin is None or end is None:
            return None
        if end.timestamp <= begin.timestamp:
            return []
        log = open_log(self.options.database)
        live = log.partitions(self.options.stream, ending_after=begin.timestamp + 1)
        return change_slices(self.options, live, begin.timestamp, end.timestamp)

    def read_time(self, batch_id: int) -> datetime | None:
        """The batch's read time, the same in every attempt at it (`logged_batch_time`)."""
        return logged_batch_time(self.checkpoint, batch_id)

    def read(self, batch_id: int) -> list[pa.RecordBatch] | int | None:
        """The batch's mods (the columns of the frame); or how many mods it has when that
        is more than `limit` (the executors' work, known without reading it); or None when
        the offset log does not say (let Spark read it)."""
        return self.read_slices(self.slices(batch_id))

    def mod_counts(self, pieces: list[ChangeSlice]) -> list[int]:
        """How many mods each slice holds, counted in the log without reading them."""
        log = open_log(self.options.database)
        return [log.log_mod_total(piece.stream, piece.token, from_micros(piece.after),
                                  from_micros(piece.until)) for piece in pieces]

    def read_slices(self, pieces: list[ChangeSlice] | None, counts: list[int] | None = None
                    ) -> list[pa.RecordBatch] | int | None:
        """`read` of the batch whose `slices` these are (`counts`: their `mod_counts`)."""
        if self.limit < 1:
            return None
        if not pieces:
            return pieces  # None: Spark reads it; []: an empty batch
        total = sum(self.mod_counts(pieces) if counts is None else counts)
        if total > self.limit:
            return total
        return [batch for piece in pieces for batch in read_changes(piece)]
