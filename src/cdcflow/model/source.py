"""Source metadata (EV-3, EV-4, EV-6): where a change came from, and each source kind's rules.

Every data change record carries a `SourceMetadata` block: the read method, the source's own
commit time, its transaction id and the position fields of the transaction (an LSN, a binlog
file). Position fields that differ per change (the LSN of each row change, a binlog event's
offset) ride on each `Mod` instead. A record without a block is a native commit of the embedded
database, whose block is derived from the record itself (`embedded_source`).

A `SourceKind` holds what EV-4 and EV-6 say per source: its read methods, the fields of its
source metadata and the `sort_keys` that order its events as they happened.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from cdcflow.errors import InvalidArgument
from cdcflow.model.timestamps import format_rfc3339, parse_timestamp, to_micros

SortKeys = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class SourceMetadata:
    """The source block of one transaction's records.

    `position` holds the transaction's position fields (EV-4), JSON values only; a change's
    own fields (`Mod.position`) are laid over them."""

    read_method: str
    source_timestamp: datetime
    tx_id: str
    position: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "read_method": self.read_method,
            "source_timestamp": format_rfc3339(self.source_timestamp),
            "tx_id": self.tx_id,
            "position": self.position,
        }

    @staticmethod
    def from_dict(data: dict[str, Any]) -> SourceMetadata:
        return SourceMetadata(
            data["read_method"],
            parse_timestamp(data["source_timestamp"]),
            str(data["tx_id"]),
            dict(data.get("position") or {}),
        )


_LSN = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")


def lsn_number(text: str) -> int:
    """A PostgreSQL LSN `X/Y` (two hex halves) as one integer, so LSNs sort as numbers."""
    found = _LSN.fullmatch(text) if isinstance(text, str) else None
    if found is None:
        raise InvalidArgument(f"LSN {text!r} is not of the form X/Y with hex halves")
    return (int(found[1], 16) << 32) | int(found[2], 16)


@dataclass(slots=True)
class ChangeContext:
    """What the rules of a kind may read about one change (one mod of one record). Not a
    record: a short-lived argument, built once per change checked (so not frozen, which
    costs twice as much to build)."""

    metadata: SourceMetadata
    position: dict[str, Any]
    commit_micros: int
    server_transaction_id: str
    record_sequence: str
    mod_index: int


@dataclass(frozen=True, slots=True)
class SourceKind:
    """EV-3/4/6 for one kind of source.

    `fields` are the names of its source metadata, besides the generic `table`, `change_type`,
    `is_deleted` and `primary_keys`; `object_fields` names the two parts of an object named
    `a.b` (e.g. schema and table), or None when objects are plain table names."""

    name: str
    cdc_method: str
    backfill_method: str
    fields: tuple[str, ...]
    object_fields: tuple[str, str] | None
    sort_keys: Callable[[ChangeContext], SortKeys]


def _log_order(change: ChangeContext) -> SortKeys:
    return (change.commit_micros, change.server_transaction_id, change.record_sequence,
            change.mod_index)


def _postgres_order(change: ChangeContext) -> SortKeys:
    """EV-6: (source_timestamp, lsn), the LSN of the change itself; a third element `part`
    orders the changes one message made (the DELETE and INSERT of a moved key)."""
    lsn = change.position.get("lsn")
    if not isinstance(lsn, str):
        raise InvalidArgument(f"a PostgreSQL change needs an 'lsn' position, got {lsn!r}")
    keys: SortKeys = (to_micros(change.metadata.source_timestamp), lsn_number(lsn))
    part = change.position.get("part")
    return keys if part is None else (*keys, int(part))


def _mysql_order(change: ChangeContext) -> SortKeys:
    """EV-6: (log_file, log_position); the rows one binlog event holds share its position,
    so `row` (and `part`, for the two changes of a moved key) follow when given."""
    log_file, log_position = change.position.get("log_file"), change.position.get("log_position")
    if not isinstance(log_file, str) or not isinstance(log_position, int):
        raise InvalidArgument(
            f"a MySQL change needs 'log_file' and 'log_position', got {log_file!r}, "
            f"{log_position!r}"
        )
    keys: SortKeys = (log_file, log_position)
    for extra in ("row", "part"):
        value = change.position.get(extra)
        if value is not None:
            keys = (*keys, int(value))
    return keys


def _watcher_order(change: ChangeContext) -> SortKeys:
    """(commit timestamp, primary key): the order a watcher polls rows in (CW-1)."""
    micros, key = change.position.get("commit_timestamp"), change.position.get("key")
    if not isinstance(micros, int) or not isinstance(key, str):
        raise InvalidArgument(f"a watcher change needs 'commit_timestamp' and 'key', got "
                              f"{micros!r}, {key!r}")
    return (micros, key)


EMBEDDED: Final = SourceKind(
    "embedded", "embedded-cdc-changestream", "embedded-backfill-snapshot",
    ("database", "tx_id", "record_sequence", "partition_token"), None, _log_order,
)
POSTGRES: Final = SourceKind(
    "postgres", "postgres-cdc-wal", "postgresql-backfill",
    ("schema", "tx_id", "lsn"), ("schema", "table"), _postgres_order,
)
MYSQL: Final = SourceKind(
    "mysql", "mysql-cdc-binlog", "mysql-backfill-fulldump",
    ("database", "log_file", "log_position"), ("database", "table"), _mysql_order,
)
WATCHER: Final = SourceKind(
    "watcher", "watcher-cdc-poll", "watcher-backfill-scan", ("target", "versions_seen"), None,
    _watcher_order,
)
KINDS: Final = (EMBEDDED, POSTGRES, MYSQL, WATCHER)


def kind_of(read_method: str) -> SourceKind:
    """The kind whose CDC or backfill read method this is."""
    for kind in KINDS:
        if read_method in (kind.cdc_method, kind.backfill_method):
            return kind
    known = [m for k in KINDS for m in (k.cdc_method, k.backfill_method)]
    raise InvalidArgument(f"read_method {read_method!r} is not one of {known}")


def is_backfill(read_method: str) -> bool:
    return kind_of(read_method).backfill_method == read_method


def object_parts(kind: SourceKind, object_name: str) -> dict[str, str]:
    """The EV-4 naming fields of an object: `{"table": name}`, or its two dotted parts."""
    if kind.object_fields is None:
        return {"table": object_name}
    first, dot, second = object_name.partition(".")
    if not dot:
        return {"table": object_name}
    return {kind.object_fields[0]: first, kind.object_fields[1]: second}


def embedded_source(commit_timestamp: datetime, server_transaction_id: str) -> SourceMetadata:
    """The block of a native commit of the embedded database: the log is the source."""
    return SourceMetadata(EMBEDDED.cdc_method, commit_timestamp, server_transaction_id)
