"""Stream definitions (EV-9): a name, a source profile, objects to include and exclude, a
backfill mode, destinations and Spark settings. Validated by pydantic; YAML or Python."""

from __future__ import annotations

import fnmatch
import zlib
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from cdcflow.errors import InvalidArgument
from cdcflow.spark.master import standalone_addresses
from cdcflow.streams.definition_input import check_size, problems, shown, yaml_problem
from cdcflow.table.metadata import MAX_FILE_RETENTION_SECONDS, MIN_FILE_RETENTION_SECONDS

_FROZEN = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
MAX_SECONDS = 100 * 365 * 86_400
"""The longest duration a setting takes (a hundred years): longer ones overflow timers."""


def _clean(text: str) -> str:
    if "\x00" in text:
        raise ValueError("the text holds a NUL character, which no setting may contain")
    try:
        text.encode()
    except UnicodeEncodeError:
        raise ValueError("the text holds a lone surrogate, which is not Unicode text (it "
                         "cannot be stored as UTF-8)") from None
    return text


Text = Annotated[str, AfterValidator(_clean)]
"""Any text without NUL characters (a NUL cuts a path, a DSN or an identifier short) or lone
surrogates (the catalog stores definitions as UTF-8 JSON)."""
Word = Annotated[str, Field(min_length=1), AfterValidator(_clean)]
"""Text that must not be empty: a path, a host, a user, a column or table name."""
_ENV = r"^[A-Za-z_][A-Za-z0-9_]*$"

def _checked_dsn(dsn: str) -> str:
    import psycopg2.extensions

    from cdcflow.capture.postgres.connection import check_dsn

    try:
        check_dsn(dsn)
    except InvalidArgument as error:
        raise ValueError(str(error)) from None
    if "password" in psycopg2.extensions.parse_dsn(dsn):
        raise ValueError("the dsn holds a password parameter; give it in the environment "
                         "instead (password_env, PGPASSWORD or PGPASSFILE)")
    return dsn


class EmbeddedSource(BaseModel):
    """The embedded database and the change stream to read."""

    model_config = _FROZEN
    kind: Literal["embedded"] = "embedded"
    database: Word
    change_stream: Word


_NAME = r"^[a-z_][a-z0-9_]{0,62}$"


class PostgresSource(BaseModel):
    """A PostgreSQL database through logical replication (pgoutput)."""

    model_config = _FROZEN
    kind: Literal["postgres"]
    dsn: Text
    password_env: str | None = Field(default=None, pattern=_ENV)
    slot: str | None = Field(default=None, pattern=_NAME)
    publication: str | None = Field(default=None, pattern=_NAME)
    heartbeat_seconds: float = Field(default=10.0, gt=0, le=MAX_SECONDS)
    primary_keys: dict[Word, tuple[Word, ...]] = Field(default_factory=dict)
    numeric_precision: dict[Word, tuple[int, int]] = Field(default_factory=dict)
    retained_wal_warning_mb: float = Field(default=1024.0, gt=0)
    chunk_rows: int = Field(default=5_000, ge=1, le=1_000_000)
    """Rows per chunk of a backfill (and of a table backfilled again)."""

    @field_validator("dsn")
    @classmethod
    def _no_password(cls, dsn: str) -> str:
        return _checked_dsn(dsn)

    @field_validator("numeric_precision")
    @classmethod
    def _precisions(cls, value: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        for column, (precision, scale) in value.items():
            if column.count(".") != 2 or not 1 <= precision <= 38 or not 0 <= scale <= precision:
                raise ValueError(f"{column}: [{precision}, {scale}] needs schema.table.column "
                                 "and 1 <= scale <= precision <= 38")
        return value


class MySqlSource(BaseModel):
    """A MySQL or MariaDB server through its row-based binlog."""

    model_config = _FROZEN
    kind: Literal["mysql"]
    host: Word
    port: int = Field(default=3306, ge=1, le=65535)
    user: Word
    password_env: str | None = Field(default=None, pattern=_ENV)
    databases: tuple[Word, ...] = Field(min_length=1)
    server_id: int | None = Field(default=None, ge=1, le=2**32 - 1)
    """The replica id the reader registers with; default: derived from the stream's name."""
    heartbeat_seconds: float = Field(default=1.0, gt=0, le=MAX_SECONDS)
    chunk_rows: int = Field(default=5_000, ge=1, le=1_000_000)
    on_position_lost: Literal["fail", "backfill"] = "fail"
    """When the binlog of the stored position has been purged: fail the stream, naming the
    position, or go on from the server's position now and backfill every table again."""


class WatchedTable(BaseModel):
    """A table a watcher polls (CW-1), with an optional shard column and the shard values
    its polls ask for (CW-5): `[low, high]`, an inclusive range, or `{in: [values]}`."""

    model_config = _FROZEN
    name: Word
    commit_timestamp_column: Word
    shard_column: Word | None = None
    shard_values: tuple[int, int] | dict[Literal["in"], tuple[int, ...]] | None = None
    soft_delete_column: Word | None = None
    """A boolean column: a row polled with it true arrives as a delete."""
    deletes_table: Word | None = None
    """PostgreSQL: the table a delete trigger fills (`cdcflow watcher prepare-postgres`)."""

    @model_validator(mode="after")
    def _shards(self) -> WatchedTable:
        if (self.shard_column is None) != (self.shard_values is None):
            raise ValueError(f"table {self.name!r}: shard_column and shard_values go together")
        if isinstance(self.shard_values, tuple) and not \
                0 <= self.shard_values[1] - self.shard_values[0] < 10_000:
            raise ValueError(f"table {self.name!r}: shard_values {list(self.shard_values)} "
                             "must be an inclusive range [low, high] of at most 10000 values")
        if isinstance(self.shard_values, dict) and not 1 <= len(
                self.shard_values.get("in", ())) <= 10_000:
            raise ValueError(f"table {self.name!r}: shard_values {self.shard_values} must be "
                             "{in: [values]} with 1..10000 values")
        return self

    def shards(self) -> tuple[int, ...] | None:
        if isinstance(self.shard_values, tuple):
            return tuple(range(self.shard_values[0], self.shard_values[1] + 1))
        return None if self.shard_values is None else tuple(self.shard_values["in"])


class EmbeddedTarget(BaseModel):
    model_config = _FROZEN
    kind: Literal["embedded"]
    database: Word


class PostgresWatchTarget(BaseModel):
    model_config = _FROZEN
    kind: Literal["postgres"]
    dsn: Word
    password_env: str | None = Field(default=None, pattern=_ENV)
    horizon_margin_seconds: float = Field(default=0.2, ge=0, le=60)

    @field_validator("dsn")
    @classmethod
    def _no_password(cls, dsn: str) -> str:
        return _checked_dsn(dsn)


class WatcherSource(BaseModel):
    """Tables polled on their commit-timestamp column (seed 001)."""

    model_config = _FROZEN
    kind: Literal["watcher"]
    target: EmbeddedTarget | PostgresWatchTarget = Field(discriminator="kind")
    tables: tuple[WatchedTable, ...] = Field(min_length=1)
    poll_interval_seconds: float = Field(default=1.0, ge=0.1, le=3600)
    adaptive: bool = True
    page_rows: int = Field(default=1_000, ge=1, le=100_000)

    @model_validator(mode="after")
    def _deletes_tables(self) -> WatcherSource:
        for table in self.tables:
            if self.target.kind == "postgres" and "." not in table.name:
                raise ValueError(f"table {table.name!r}: name PostgreSQL tables as "
                                 "schema.table")
            if table.deletes_table is not None and self.target.kind != "postgres":
                raise ValueError(f"table {table.name!r}: deletes_table is for PostgreSQL "
                                 "targets; use soft_delete_column")
        return self


Source = Annotated[EmbeddedSource | PostgresSource | MySqlSource | WatcherSource,
                   Field(discriminator="kind")]
"""Every kind of source, told apart by `kind` (a definition without one is `embedded`)."""


class CdcTableDestination(BaseModel):
    """One CDC table per object under `warehouse`."""

    model_config = _FROZEN
    kind: Literal["cdc_table"] = "cdc_table"
    warehouse: Word
    max_staleness_seconds: float | None = Field(default=None, gt=0, le=MAX_SECONDS)
    delete_retention_seconds: float = Field(default=2 * 86_400, ge=0, le=MAX_SECONDS)
    file_retention_seconds: float = Field(default=MIN_FILE_RETENTION_SECONDS,
                                          ge=MIN_FILE_RETENTION_SECONDS,
                                          le=MAX_FILE_RETENTION_SECONDS)


class EventFilesDestination(BaseModel):
    """Event files under `root` (JSON lines or Avro)."""

    model_config = _FROZEN
    kind: Literal["event_files"] = "event_files"
    root: Word
    format: Literal["json", "avro"] = "json"
    max_events: int = Field(default=10_000, ge=1, le=2**63 - 1)
    max_bytes: int = Field(default=64 * 1024 * 1024, ge=1, le=2**63 - 1)
    max_seconds: float = Field(default=60.0, gt=0, le=MAX_SECONDS)


Destination = Annotated[CdcTableDestination | EventFilesDestination, Field(discriminator="kind")]


DEFAULT_MAX_RECORDS = 25_000
"""A batch's changes unless a stream says otherwise: the size bench_pg_throughput,
bench_throughput and bench_spark run with (100,000 drained a backlog slower: README)."""


class SparkSettings(BaseModel):
    model_config = _FROZEN
    master: Word = "local[*]"
    trigger_seconds: float = Field(default=1.0, gt=0, le=MAX_SECONDS)
    max_records_per_trigger: int = Field(default=DEFAULT_MAX_RECORDS, ge=1, le=2**63 - 1)
    """At most about this many changes a batch (cut between commit timestamps), so that a
    backlog after a long pause is not one batch, held in memory whole by the tasks that fold
    it. Null means the default: definitions stored when the default was no limit hold it."""
    driver_batch_rows: int = Field(default=20_000, ge=0, le=10_000_000)
    """A batch of at most this many changes is folded and written on the driver, without a
    Spark job (latency); 0 sends every batch to the executors."""
    storage_root: Word | None = None
    """On a cluster: an absolute path that every executor reaches (NFS, or a disk mounted
    at the same place everywhere). The destinations must lie under it; the stream's log
    segments and its own row state go there (README "Running on a cluster")."""

    @field_validator("max_records_per_trigger", mode="before")
    @classmethod
    def _default_for_null(cls, limit: object) -> object:
        return DEFAULT_MAX_RECORDS if limit is None else limit

    @field_validator("master")
    @classmethod
    def _known_master(cls, master: str) -> str:
        standalone_addresses(master)  # the form only: nothing is reached at definition time
        return master

    @field_validator("storage_root")
    @classmethod
    def _absolute_root(cls, root: str | None) -> str | None:
        if root is not None and not Path(root).is_absolute():
            raise ValueError(f"storage_root {root!r} must be an absolute path, the same on "
                             "every machine of the cluster")
        return root


class Held(NamedTuple):
    """A thing a stream holds on its source (`StreamDefinition.held_on_source`): what it is,
    its name, and the servers (or databases) it may be on."""

    what: str
    value: str
    servers: frozenset[str]


def folded_name(name: str) -> str:
    """A stream name as what it names sees it: its default replication slot and publication
    ignore letter case and `-` against `_`, and a filesystem that folds case (macOS's, by
    default) ignores letter case in its log, state and event folders. Two streams of one
    catalog must differ here (`Catalog.create`)."""
    return name.lower().replace("-", "_")


class StreamDefinition(BaseModel):
    """A stream: one source to its destinations (EV-1)."""

    model_config = _FROZEN
    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")
    source: Source
    include: tuple[Text, ...] = ("*",)
    exclude: tuple[Text, ...] = ()
    backfill: Literal["all", "none"] = "all"
    destinations: tuple[Destination, ...] = Field(min_length=1)
    spark: SparkSettings = SparkSettings()

    @model_validator(mode="before")
    @classmethod
    def _default_source_kind(cls, data: Any) -> Any:
        source = data.get("source") if isinstance(data, dict) else None
        if isinstance(source, dict) and "kind" not in source:
            return data | {"source": source | {"kind": "embedded"}}
        return data

    def slot_name(self) -> str:
        """The default replication slot and publication name: cdcflow_<stream name>."""
        return f"cdcflow_{folded_name(self.name)}"

    def replica_server_id(self) -> int:
        """A MySQL source's replica server_id: given, or derived from the stream's name
        (distinct from common small ids)."""
        given = self.source.server_id if isinstance(self.source, MySqlSource) else None
        return given or 100_000 + zlib.crc32(self.name.encode()) % 1_000_000_000

    def held_on_source(self) -> dict[str, Held]:
        """What the stream holds on its source server that a second stream must not hold
        too, by the field that names it: its PostgreSQL slot (on the server) and publication
        (in the database), its MySQL replica server_id. Servers as the definition writes
        them."""
        if isinstance(self.source, PostgresSource):
            from cdcflow.capture.postgres.connection import databases_of, servers_of

            dsn = self.source.dsn
            return {"source.slot": Held("replication slot", self.slot(), servers_of(dsn)),
                    "source.publication": Held("publication", self.publication(),
                                               databases_of(dsn))}
        if isinstance(self.source, MySqlSource):
            server = frozenset({f"{self.source.host}:{self.source.port}"})
            return {"source.server_id": Held("replica server_id",
                                             str(self.replica_server_id()), server)}
        return {}

    def slot(self) -> str:
        """A PostgreSQL source's replication slot: given, or `slot_name()`."""
        given = self.source.slot if isinstance(self.source, PostgresSource) else None
        return given or self.slot_name()

    def publication(self) -> str:
        """A PostgreSQL source's publication: given, or `slot_name()`."""
        given = self.source.publication if isinstance(self.source, PostgresSource) else None
        return given or self.slot_name()

    def selects(self, object_name: str) -> bool:
        included = any(fnmatch.fnmatchcase(object_name, p) for p in self.include)
        return included and not any(fnmatch.fnmatchcase(object_name, p) for p in self.exclude)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    @staticmethod
    def parse(data: Any) -> StreamDefinition:
        """A definition from plain data (a dict); InvalidArgument names each bad field, its
        value (passwords hidden) and the rule it breaks."""
        check_size(data)
        try:
            return StreamDefinition.model_validate(data)
        except ValidationError as error:
            raise InvalidArgument(f"invalid stream definition: {problems(error)}") from None

    @staticmethod
    def from_yaml(text: str | bytes) -> StreamDefinition:
        """A definition from YAML text (bytes: UTF-8 or UTF-16 with a BOM)."""
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise InvalidArgument(
                f"stream definition is not valid YAML: {yaml_problem(error)}") from None
        except RecursionError:
            raise InvalidArgument("stream definition is not valid YAML: it nests too deep "
                                  "for the parser") from None
        if not isinstance(data, dict):
            raise InvalidArgument(f"a stream definition is a YAML mapping, not "
                                  f"{type(data).__name__} {shown(data)}")
        return StreamDefinition.parse(data)

    @staticmethod
    def from_file(path: str | Path) -> StreamDefinition:
        """A definition from a YAML file (`cdcflow streams create FILE`)."""
        try:
            text = Path(path).read_bytes()
        except OSError as error:
            raise InvalidArgument(f"cannot read the stream definition {str(path)!r}: "
                                  f"{error.strerror or error}") from None
        return StreamDefinition.from_yaml(text)
