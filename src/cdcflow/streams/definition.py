"""Stream definitions (EV-9): a name, a source profile, objects to include and exclude, a
backfill mode, destinations and Spark settings. Validated by pydantic; YAML or Python."""

from __future__ import annotations

import fnmatch
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from cdcflow.errors import InvalidArgument

_FROZEN = ConfigDict(frozen=True, extra="forbid")



def _checked_dsn(dsn: str) -> str:
    from cdcflow.capture.postgres.connection import check_dsn

    try:
        return check_dsn(dsn)
    except InvalidArgument as error:
        raise ValueError(str(error)) from None

class EmbeddedSource(BaseModel):
    """The embedded database and the change stream to read."""

    model_config = _FROZEN
    kind: Literal["embedded"] = "embedded"
    database: str
    change_stream: str


_NAME = r"^[a-z_][a-z0-9_]{0,62}$"


class PostgresSource(BaseModel):
    """A PostgreSQL database through logical replication (pgoutput)."""

    model_config = _FROZEN
    kind: Literal["postgres"]
    dsn: str
    password_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    slot: str | None = Field(default=None, pattern=_NAME)
    publication: str | None = Field(default=None, pattern=_NAME)
    heartbeat_seconds: float = Field(default=10.0, gt=0)
    primary_keys: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    numeric_precision: dict[str, tuple[int, int]] = Field(default_factory=dict)
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
    host: str = Field(min_length=1)
    port: int = Field(default=3306, ge=1, le=65535)
    user: str = Field(min_length=1)
    password_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    databases: tuple[str, ...] = Field(min_length=1)
    server_id: int | None = Field(default=None, ge=1, le=2**32 - 1)
    """The replica id the reader registers with; default: derived from the stream's name."""
    heartbeat_seconds: float = Field(default=1.0, gt=0)
    chunk_rows: int = Field(default=5_000, ge=1, le=1_000_000)
    on_position_lost: Literal["fail", "backfill"] = "fail"
    """When the binlog of the stored position has been purged: fail the stream, naming the
    position, or go on from the server's position now and backfill every table again."""


class WatchedTable(BaseModel):
    """A table a watcher polls (CW-1), with an optional shard column and the shard values
    its polls ask for (CW-5): `[low, high]`, an inclusive range, or `{in: [values]}`."""

    model_config = _FROZEN
    name: str = Field(min_length=1)
    commit_timestamp_column: str = Field(min_length=1)
    shard_column: str | None = Field(default=None, min_length=1)
    shard_values: tuple[int, int] | dict[Literal["in"], tuple[int, ...]] | None = None
    soft_delete_column: str | None = Field(default=None, min_length=1)
    """A boolean column: a row polled with it true arrives as a delete."""
    deletes_table: str | None = Field(default=None, min_length=1)
    """PostgreSQL: the table a delete trigger fills (`cdcflow watcher prepare-postgres`)."""

    @model_validator(mode="after")
    def _shards(self) -> WatchedTable:
        if (self.shard_column is None) != (self.shard_values is None):
            raise ValueError(f"table {self.name!r}: shard_column and shard_values go together")
        if isinstance(self.shard_values, tuple) and not \
                0 <= self.shard_values[1] - self.shard_values[0] < 10_000:
            raise ValueError(f"table {self.name!r}: shard_values {list(self.shard_values)} "
                             "must be an inclusive range [low, high] of at most 10000 values")
        if isinstance(self.shard_values, dict) and not 1 <= len(self.shard_values["in"]) \
                <= 10_000:
            raise ValueError(f"table {self.name!r}: shard_values in: lists 1..10000 values")
        return self

    def shards(self) -> tuple[int, ...] | None:
        if isinstance(self.shard_values, tuple):
            return tuple(range(self.shard_values[0], self.shard_values[1] + 1))
        return None if self.shard_values is None else tuple(self.shard_values["in"])


class EmbeddedTarget(BaseModel):
    model_config = _FROZEN
    kind: Literal["embedded"]
    database: str = Field(min_length=1)


class PostgresWatchTarget(BaseModel):
    model_config = _FROZEN
    kind: Literal["postgres"]
    dsn: str = Field(min_length=1)
    password_env: str | None = None
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
    warehouse: str
    max_staleness_seconds: float | None = Field(default=None, gt=0)
    delete_retention_seconds: float = Field(default=2 * 86_400, ge=0)


class EventFilesDestination(BaseModel):
    """Event files under `root` (JSON lines or Avro)."""

    model_config = _FROZEN
    kind: Literal["event_files"] = "event_files"
    root: str
    format: Literal["json", "avro"] = "json"
    max_events: int = Field(default=10_000, ge=1)
    max_bytes: int = Field(default=64 * 1024 * 1024, ge=1)
    max_seconds: float = Field(default=60.0, gt=0)


Destination = Annotated[CdcTableDestination | EventFilesDestination, Field(discriminator="kind")]


class SparkSettings(BaseModel):
    model_config = _FROZEN
    master: str = "local[*]"
    trigger_seconds: float = Field(default=1.0, gt=0)
    max_records_per_trigger: int | None = Field(default=None, ge=1)


class StreamDefinition(BaseModel):
    """A stream: one source to its destinations (EV-1)."""

    model_config = _FROZEN
    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")
    source: Source
    include: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ()
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
        """The replication slot (and publication) name: given, or cdcflow_<stream name>."""
        return f"cdcflow_{self.name.lower().replace('-', '_')}"

    def selects(self, object_name: str) -> bool:
        included = any(fnmatch.fnmatchcase(object_name, p) for p in self.include)
        return included and not any(fnmatch.fnmatchcase(object_name, p) for p in self.exclude)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    @staticmethod
    def parse(data: dict[str, Any]) -> StreamDefinition:
        try:
            return StreamDefinition.model_validate(data)
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']} (got {e.get('input')!r})"
                for e in error.errors()
            )
            raise InvalidArgument(f"invalid stream definition: {problems}") from None

    @staticmethod
    def from_yaml(text: str) -> StreamDefinition:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise InvalidArgument(f"stream definition is not valid YAML: {error}") from None
        if not isinstance(data, dict):
            raise InvalidArgument("a stream definition is a YAML mapping")
        return StreamDefinition.parse(data)
