"""Options of the "cdcflow" data source, validated: unknown names and bad values are errors."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cdcflow.errors import InvalidArgument
from cdcflow.store.segments import storage

KNOWN = {
    "database": "path of the embedded database file",
    "path": "same as database (from .load(path))",
    "stream": "change stream to read",
    "table": "table to snapshot (batch reads)",
    "startingtimestamp": "earliest | latest | RFC 3339 timestamp",
    "endingtimestamp": "RFC 3339 timestamp (batch reads of a change range)",
    "readtimestamp": "RFC 3339 timestamp of a table snapshot (default: now)",
    "heartbeatmilliseconds": "1000..300000",
    "maxrecordspertrigger": "admission control: about this many rows per micro-batch",
    "rawrecords": "true: one row per raw record, heartbeats and child partitions too",
    "numpartitions": "key-hash ranges of a table snapshot",
    "controlpath": "a control file holding the query (see cdcflow.spark.queries)",
    "segmentroot": "a storage root every executor reaches: the driver seals each slice of "
                   "the log (or of a table snapshot) there and executors read that, never "
                   "the log or the database (clusters)",
}


@dataclass(frozen=True, slots=True)
class SourceOptions:
    database: str
    stream: str | None
    table: str | None
    starting: str | None
    ending: str | None
    read_timestamp: str | None
    heartbeat_ms: int
    max_records: int | None
    raw: bool
    num_partitions: int
    control_path: str | None = None
    segment_root: str | None = None


def _int(options: Mapping[str, str], name: str, default: int | None, low: int,
         high: int) -> int | None:
    text = options.get(name)
    if text is None:
        return default
    try:
        value = int(str(text))
    except ValueError:
        raise InvalidArgument(f"option {name} = {text!r} must be an integer") from None
    if not low <= value <= high:
        raise InvalidArgument(f"option {name} = {value} must be in {low}..{high}")
    return value


def parse_options(raw: Mapping[str, str]) -> SourceOptions:
    options = {str(k).lower(): str(v) for k, v in raw.items()}
    unknown = sorted(set(options) - set(KNOWN))
    if unknown:
        raise InvalidArgument(
            f"unknown option(s) {unknown} for format 'cdcflow'; known options: "
            + ", ".join(sorted(KNOWN))
        )
    database = options.get("database") or options.get("path")
    if not database:
        raise InvalidArgument("option 'database' (the embedded database file) is required")
    if ("stream" in options) == ("table" in options):
        raise InvalidArgument("give exactly one of the options 'stream' or 'table'")
    raw_flag = options.get("rawrecords", "false").lower()
    if raw_flag not in ("true", "false"):
        raise InvalidArgument(f"option rawRecords = {raw_flag!r} must be true or false")
    heartbeat = _int(options, "heartbeatmilliseconds", 1000, 1000, 300_000)
    partitions = _int(options, "numpartitions", 4, 1, 1024)
    segment_root = options.get("segmentroot")
    if segment_root is not None:
        storage(segment_root)  # an absolute path or a URI pyarrow reaches
    assert heartbeat is not None and partitions is not None
    return SourceOptions(
        database=database,
        stream=options.get("stream"),
        table=options.get("table"),
        starting=options.get("startingtimestamp"),
        ending=options.get("endingtimestamp"),
        read_timestamp=options.get("readtimestamp"),
        heartbeat_ms=heartbeat,
        max_records=_int(options, "maxrecordspertrigger", None, 1, 1 << 40),
        raw=raw_flag == "true",
        num_partitions=partitions,
        control_path=options.get("controlpath"),
        segment_root=segment_root,
    )
