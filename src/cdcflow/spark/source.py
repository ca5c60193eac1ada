"""The "cdcflow" Spark data source (Python Data Source API).

Streaming: `spark.readStream.format("cdcflow").option("database", ...).option("stream", ...)`.
Batch: a table snapshot at a timestamp (`table`, `readTimestamp`), split in key-hash ranges, or
a bounded range of changes (`stream`, `startingTimestamp`, `endingTimestamp`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from cdcflow.errors import InvalidArgument, OutOfRange
from cdcflow.model.partitions import PartitionMetadata
from cdcflow.model.schema import KEY_HASH_SPACE
from cdcflow.model.timestamps import as_datetime, format_rfc3339, from_micros, to_micros
from cdcflow.spark.offsets import StreamOffset, admit, batch_end, frontier_at
from cdcflow.spark.options import SourceOptions, parse_options
from cdcflow.spark.queries import acknowledge, read_control
from cdcflow.spark.reading import (
    ChangeSlice,
    SnapshotSlice,
    change_slices,
    read_changes,
    read_snapshot,
    seal_slices,
    seal_snapshot_slices,
    snapshot_source,
)
from cdcflow.spark.schema import CHANGE_COLUMNS, RAW_COLUMNS, ddl_of, table_columns
from cdcflow.store.changelog import LogReader, open_log
from cdcflow.store.database import Database
from cdcflow.store.segments import drop_segments_until, sweep_unfinished

_IDLE_SLEEP_MAX = 0.5


class SlicePartition(InputPartition):  # type: ignore[misc]
    """A picklable input partition carrying one slice to read."""

    def __init__(self, piece: ChangeSlice | SnapshotSlice) -> None:
        super().__init__(piece)
        self.piece = piece


class ChangeStreamSource(DataSource):  # type: ignore[misc]
    """Format "cdcflow": change streams and table snapshots of the embedded database."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = parse_options(options)
        if self.parsed.stream is not None:
            self.log: LogReader = open_log(self.parsed.database)
            self.log.change_stream(self.parsed.stream)
        else:
            assert self.parsed.table is not None
            self.database = Database.open(self.parsed.database, create=False)
            self.database.table_schema(self.parsed.table)

    @classmethod
    def name(cls) -> str:
        return "cdcflow"

    def schema(self) -> str:
        if self.parsed.table is not None:
            return ddl_of(table_columns(self.database.table_schema(self.parsed.table)))
        return ddl_of(RAW_COLUMNS if self.parsed.raw else CHANGE_COLUMNS)

    def reader(self, schema: Any) -> DataSourceReader:
        if self.parsed.table is not None:
            return SnapshotReader(self.parsed, self.database)
        return ChangeRangeReader(self.parsed, self.log)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        if self.parsed.stream is None:
            raise InvalidArgument("streaming reads need the option 'stream', not 'table'")
        return ChangeStreamReader(self.parsed, self.log)


def _slices(
    options: SourceOptions, partitions: list[PartitionMetadata], after: int, until: int
) -> list[SlicePartition]:
    """A slice per partition whose span meets [after + 1, until]; with a segment root, each
    slice is sealed there first (in parts when large), for executors that can't open the
    log."""
    pieces = seal_slices(change_slices(options, partitions, after, until))
    return [SlicePartition(piece) for piece in pieces]


def _starting_micros(options: SourceOptions, database: LogReader) -> int:
    """Micros of the last consumed instant before the first record to read."""
    assert options.stream is not None
    earliest = to_micros(database.earliest_readable(options.stream))
    text = (options.starting or "latest").strip()
    if text.lower() == "earliest":
        return earliest - 1
    if text.lower() == "latest":
        return to_micros(database.current_timestamp())
    start = to_micros(as_datetime(text))
    now = to_micros(database.clock.now())
    if start > now:
        raise InvalidArgument(f"startingTimestamp {text} is in the future")
    if start < earliest:
        raise OutOfRange(
            f"startingTimestamp {text} is outside the retention of change stream "
            f"{options.stream!r}; the earliest valid timestamp is {format_rfc3339(earliest)}"
        )
    return start - 1


class ChangeRangeReader(DataSourceReader):  # type: ignore[misc]
    """Batch read of the changes with starting <= commit_timestamp <= ending."""

    def __init__(self, options: SourceOptions, database: LogReader) -> None:
        if options.ending is None:
            raise InvalidArgument("a batch read of a stream needs option 'endingTimestamp'")
        self.options = options
        self.after = _starting_micros(options, database)
        self.until = to_micros(as_datetime(options.ending))
        if self.until <= self.after:
            raise InvalidArgument(
                f"endingTimestamp {options.ending} is before startingTimestamp {options.starting}"
            )
        safe = to_micros(database.current_timestamp())
        if self.until > safe:
            self.until = to_micros(database.close_until(from_micros(self.until)))
        assert options.stream is not None
        self.partition_list = database.partitions(options.stream, self.after + 1)

    def partitions(self) -> Sequence[InputPartition]:
        return _slices(self.options, self.partition_list, self.after, self.until)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SlicePartition) and isinstance(partition.piece, ChangeSlice)
        return read_changes(partition.piece)


class SnapshotReader(DataSourceReader):  # type: ignore[misc]
    """Batch read of a consistent table snapshot, split in key-hash ranges."""

    def __init__(self, options: SourceOptions, database: Database) -> None:
        self.options = options
        stamp = options.read_timestamp
        when = database.current_timestamp() if stamp is None else as_datetime(stamp)
        database.scan(str(options.table), when, (0, 0))  # validates and closes the timestamp
        self.read_micros = to_micros(when)

    def partitions(self) -> Sequence[InputPartition]:
        count = self.options.num_partitions
        bounds = [KEY_HASH_SPACE * i // count for i in range(count + 1)]
        source = "" if self.options.segment_root is None else snapshot_source(
            self.options.database)
        pieces = [SnapshotSlice(self.options.database, str(self.options.table),
                                self.read_micros, bounds[i], bounds[i + 1],
                                self.options.segment_root, source) for i in range(count)]
        seal_snapshot_slices(pieces)
        return [SlicePartition(piece) for piece in pieces]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SlicePartition)
        assert isinstance(partition.piece, SnapshotSlice)
        return read_snapshot(partition.piece)


class ChangeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """Micro-batches aligned to one global safe timestamp; see `cdcflow.spark.offsets`.

    Resume invariant: everything is derived from the offsets Spark checkpoints; the reader
    keeps no state that a restart would need. `commit` acknowledges nothing upstream.
    """

    def __init__(self, options: SourceOptions, database: LogReader) -> None:
        self.options = options
        self.database = database
        self.stream = str(options.stream)
        self.target: int | None = None
        self.last: StreamOffset | None = None
        self.idle = 0
        if options.segment_root is not None:  # the query starts: nothing seals there yet
            sweep_unfinished(options.segment_root)

    def _offset_at(self, micros: int) -> StreamOffset:
        return StreamOffset(micros, frontier_at(self._live(micros), micros))

    def _live(self, consumed: int) -> list[PartitionMetadata]:
        """The partitions a read after `consumed` can meet (not the finished lineage)."""
        return self.database.partitions(self.stream, ending_after=consumed + 1)

    def initialOffset(self) -> dict[str, Any]:
        return self._offset_at(_starting_micros(self.options, self.database)).to_dict()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_records)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = to_micros(self.database.current_timestamp())

    def latestOffset(self, start: dict[str, Any] | None = None,
                     limit: ReadLimit | None = None) -> dict[str, Any]:
        if start is not None:
            begin = StreamOffset.from_dict(start)
        elif self.last is not None:
            begin = self.last
        else:
            begin = StreamOffset.from_dict(self.initialOffset())
        self._check_retention(begin)
        safe = to_micros(self.database.current_timestamp())
        if self.target is not None:
            safe = min(safe, self.target)
        control = read_control(self.options.control_path)
        if control is not None:  # held: see cdcflow.spark.queries
            until = control.get("until")
            safe = min(safe, begin.timestamp if until is None else int(until))
        if safe <= begin.timestamp:
            if control is not None and self.options.control_path:
                acknowledge(self.options.control_path, str(control["token"]))
            self._rest()
            return begin.to_dict()
        self.idle = 0
        partitions = self._live(begin.timestamp)
        fresh = StreamOffset(begin.timestamp, frontier_at(partitions, begin.timestamp))
        end = batch_end(partitions, fresh, safe)
        max_rows = self._max_rows(limit)
        if max_rows is not None:
            bound, counts = self.database.log_admission_counts(
                self.stream, list(fresh.frontier), from_micros(begin.timestamp),
                from_micros(end), max_rows)
            end = admit(counts, begin.timestamp, bound, max_rows)
        self.last = StreamOffset(end, frontier_at(partitions, end))
        return self.last.to_dict()

    def _max_rows(self, limit: ReadLimit | None) -> int | None:
        if isinstance(limit, ReadMaxRows):
            return int(limit.max_rows)
        if limit is None:
            return self.options.max_records
        return None

    def _check_retention(self, begin: StreamOffset) -> None:
        earliest = to_micros(self.database.earliest_readable(self.stream))
        if begin.timestamp + 1 < earliest:
            raise OutOfRange(
                f"the query's position {format_rfc3339(begin.timestamp + 1)} is outside the "
                f"retention of change stream {self.stream!r}; the earliest valid timestamp is "
                f"{format_rfc3339(earliest)}"
            )

    def _rest(self) -> None:
        """Idle: back off a little so an idle stream does not spin the CPU."""
        if self.target is not None:
            return
        self.idle += 1
        time.sleep(min(0.05 * self.idle, _IDLE_SLEEP_MAX))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, finish = StreamOffset.from_dict(start), StreamOffset.from_dict(end)
        if finish.timestamp <= begin.timestamp:
            return []
        partitions = self._live(begin.timestamp)
        return _slices(self.options, partitions, begin.timestamp, finish.timestamp)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SlicePartition) and isinstance(partition.piece, ChangeSlice)
        return read_changes(partition.piece)

    def commit(self, end: dict[str, Any]) -> None:
        """Runs one batch late (ARCHITECTURE): nothing is acknowledged upstream here. The
        segments of batches up to `end` are dropped: no replay reads them again."""
        if self.options.segment_root is not None:
            drop_segments_until(self.options.segment_root, StreamOffset.from_dict(end).timestamp)
