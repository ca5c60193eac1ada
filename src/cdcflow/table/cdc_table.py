"""`CdcTable`: a table that applies streamed UPSERT/DELETE changes in sequence order
(the BigQuery CDC model, AP-1..AP-10), stored as a Delta Lake table any Delta reader opens.
"""

from __future__ import annotations

import bisect
import json
import math
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.schema import Schema as DeltaSchema

from cdcflow.clock import SYSTEM_CLOCK, Clock
from cdcflow.errors import AlreadyExists, FailedPrecondition, InvalidArgument
from cdcflow.model.sequence import sort_key_of
from cdcflow.model.timestamps import from_micros, to_micros
from cdcflow.table import pending
from cdcflow.table.apply import (
    JOB,
    ApplyPlan,
    apply_lock,
    commit_apply,
    epoch_seconds,
    in_parallel,
    load_sorted,
    plan_apply,
)
from cdcflow.table.arrow_types import check_schema, schema_from_ddl
from cdcflow.table.connection import Connection
from cdcflow.table.delta_log import supports_vectors
from cdcflow.table.layout import conform, read_data, read_file
from cdcflow.table.merge import key_array
from cdcflow.table.metadata import (
    MIN_FILE_RETENTION_SECONDS,
    TableOptions,
    load_options,
    save_options,
)
from cdcflow.table.snapshots import live_paths, newest, newest_manifest
from cdcflow.table.vacuum import Vacuumed, vacuum


class CdcTable:
    """Create with `CdcTable.create(...)`, open with `CdcTable.open(path)`."""

    def __init__(self, root: Path, options: TableOptions, clock: Clock) -> None:
        self.root = root
        self._options = options
        self.clock = clock
        self._background: tuple[threading.Thread, threading.Event] | None = None

    @classmethod
    def create(
        cls,
        path: str | Path,
        schema: pa.Schema | str,
        primary_key: list[str],
        max_staleness: timedelta | None = None,
        delete_retention: timedelta = timedelta(days=2),
        target_file_rows: int = 250_000,
        clock: Clock | None = None,
        deletion_vectors: bool = False,
        file_retention: timedelta = timedelta(seconds=MIN_FILE_RETENTION_SECONDS),
    ) -> CdcTable:
        root = Path(path)
        arrow = schema_from_ddl(schema) if isinstance(schema, str) else schema
        check_schema(arrow, list(primary_key))
        if DeltaTable.is_deltatable(str(root)):
            raise AlreadyExists(f"a table exists already at {root}")
        options = TableOptions(tuple(primary_key), None, 0.0, target_file_rows).altered(
            max_staleness=max_staleness, delete_retention=delete_retention,
            deletion_vectors=deletion_vectors, file_retention=file_retention)
        DeltaTable.create(str(root), arrow)
        pending.create_pending(root, arrow)
        save_options(root, options)
        return cls(root, options, clock or SYSTEM_CLOCK)

    @classmethod
    def ensure(cls, path: str | Path, schema: pa.Schema, primary_key: list[str],
               **options: Any) -> CdcTable:
        """The table at `path`, created with `schema`, key and options if it is not there."""
        if (Path(path) / "_cdcflow" / "table.json").exists():
            return cls.open(path, clock=options.get("clock"))
        return cls.create(path, schema, primary_key, **options)

    @classmethod
    def open(cls, path: str | Path, clock: Clock | None = None) -> CdcTable:
        root = Path(path)
        return cls(root, load_options(root), clock or SYSTEM_CLOCK)

    # ---- metadata (AP-5, AP-6) ------------------------------------------------------------

    @property
    def schema(self) -> pa.Schema:
        return pa.schema(newest(self.root).schema().to_arrow())

    @property
    def primary_key(self) -> tuple[str, ...]:
        return self._options.primary_key

    @property
    def options(self) -> dict[str, Any]:
        self._options = load_options(self.root)
        return self._options.public()

    def alter(self, **changes: Any) -> None:
        """Change options, e.g. `alter(max_staleness=timedelta(minutes=15))`."""
        self._options = load_options(self.root).altered(**changes)
        save_options(self.root, self._options)

    @property
    def upsert_stream_apply_watermark(self) -> datetime | None:
        """The time up to which streamed changes are applied; None before any apply."""
        watermark = newest_manifest(self.root).watermark
        return None if watermark is None else from_micros(watermark)

    def add_columns(self, fields: list[pa.Field]) -> list[str]:
        """Add nullable columns that the table lacks (a source's ADD COLUMN); rows written
        before hold NULL in them. Returns the names added."""
        unique = list({f.name: f.with_nullable(True) for f in fields}.values())
        with apply_lock(self.root):
            added = [f.name for f in unique if f.name not in self.schema.names]
            check_schema(pa.schema([*self.schema, *(f for f in unique if f.name in added)]),
                         list(self.primary_key))
            # the pending table first: each table's own schema says what it still lacks, so
            # a retry after a crash between the two finishes the job
            for path in (pending.pending_path(self.root), str(self.root)):
                names = pa.schema(DeltaTable(path).schema().to_arrow()).names
                missing = [f for f in unique if f.name not in names]
                if missing:
                    DeltaTable(path).alter.add_columns(
                        list(DeltaSchema.from_arrow(pa.schema(missing)).fields))
        return added

    # ---- writes ---------------------------------------------------------------------------

    def connection(self) -> Connection:
        return Connection(self)

    def apply(self) -> dict[str, Any]:
        """Run one apply job now; return its stats (duration, changes, files rewritten)."""
        with apply_lock(self.root):
            started = epoch_seconds(self.clock)
            watermark = to_micros(self.clock.now())
            self._options = load_options(self.root)
            plan = plan_apply(self.root, self.schema, self.primary_key, watermark,
                              self._retention(), merge_on_read=self._options.deletion_vectors)
            return commit_apply(self.root, plan, self.primary_key,
                                self._options.target_file_rows, watermark, started, self.clock)

    def vacuum(self, retention: timedelta | None = None, enforce_retention: bool = True
               ) -> Vacuumed:
        """Delete the files no version in use within `retention` (default: file_retention)
        names (`cdcflow.table.vacuum`)."""
        if retention is None:
            self._options = load_options(self.root)
            retention = timedelta(seconds=self._options.file_retention_seconds)
        return vacuum(self.root, retention, self.clock, enforce_retention)

    def _retention(self) -> int:
        return int(self._options.delete_retention_seconds * 1_000_000)

    def _plan(self, now_micros: int, only_keys: pa.Array | None = None) -> ApplyPlan:
        return plan_apply(self.root, self.schema, self.primary_key, now_micros,
                          self._retention(), only_keys)

    def start_background_apply(self, interval: timedelta | None = None) -> None:
        """Apply at least once per max_staleness (AP-5), in a daemon thread."""
        if self._background is not None:
            raise FailedPrecondition("background apply is already running")
        staleness = self.options["max_staleness"]
        every = interval or (staleness / 2 if staleness else timedelta(seconds=5))
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(every.total_seconds()):
                self.apply()

        thread = threading.Thread(target=loop, name=f"apply:{self.root}", daemon=True)
        thread.start()
        self._background = (thread, stop)

    def stop_background_apply(self) -> None:
        if self._background is not None:
            thread, stop = self._background
            stop.set()
            thread.join()
            self._background = None

    # ---- reads (AP-5, AP-9, AP-10) --------------------------------------------------------

    def has_pending_changes(self) -> bool:
        paths = live_paths(pending.pending_path(self.root))  # before the manifest
        manifest = newest_manifest(self.root)
        return any(p not in manifest.applied_pending for p in paths)

    def pending_row_count(self) -> int:
        """Rows appended and not applied yet."""
        actions = pa.table(newest(pending.pending_path(self.root)).get_add_actions(
            flatten=True)).to_pylist()
        manifest = newest_manifest(self.root)
        return sum(int(a.get("num_records") or 0) for a in actions
                   if a["path"] not in manifest.applied_pending)

    def is_within_staleness(self) -> bool:
        staleness = self._options.max_staleness_seconds
        watermark = newest_manifest(self.root).watermark
        if staleness is None or watermark is None:
            return False
        age = to_micros(self.clock.now()) - watermark
        return age <= staleness * 1_000_000

    def to_arrow(self) -> pa.Table:
        """The table per AP-5: the last applied version inside max_staleness (cheap, maybe
        stale), otherwise a runtime merge of the pending changes (fresh). The pseudo-columns
        never appear (AP-10)."""
        self._options = load_options(self.root)
        if self.is_within_staleness() or not self.has_pending_changes():
            return self._baseline()
        return self._merged(self._plan(to_micros(self.clock.now())))

    def _baseline(self) -> pa.Table:
        """The applied rows. Ranges with a deletion vector are read through the manifest:
        deltalake's pyarrow reader refuses tables that have them."""
        table = newest(self.root)
        if not supports_vectors(table):
            return table.to_pyarrow_table()
        return self._merged(ApplyPlan(newest_manifest(self.root), [], 0))

    def _merged(self, plan: ApplyPlan) -> pa.Table:
        schema = self.schema
        parts = in_parallel(lambda f: read_data(self.root, f, schema),
                            [f for i, f in enumerate(plan.manifest.files) if i not in plan.touched])
        parts += [data for data, _ in plan.touched.values()]
        return pa.concat_tables([conform(p, schema) for p in parts]) if parts else \
            schema.empty_table()

    def applied_parts(self) -> Iterator[pa.Table]:
        """The applied rows, one key range's file at a time (memory bounded by a range), from
        one manifest: what `to_arrow` returns when nothing is pending."""
        schema = self.schema
        for entry in newest_manifest(self.root).files:
            yield conform(read_data(self.root, entry, schema), schema)

    def bulk_load(self, rows: pa.Table) -> dict[str, Any]:
        """Load an initial snapshot (a backfill) into an empty table in one commit, fast:
        rows are sorted and cut into ranges by Arrow, with no per-row Python work. Keys must be
        unique; their order is the lowest (an empty sequence number), so any streamed change
        of the same key wins."""
        with apply_lock(self.root):
            if newest_manifest(self.root).files:
                raise FailedPrecondition(f"bulk_load needs an empty table; {self.root} has rows")
            schema, key_columns = self.schema, self.primary_key
            data = rows.select(schema.names).cast(schema)
            keys = key_array(data, key_columns)
            if pc.count_distinct(keys).as_py() != data.num_rows:
                raise InvalidArgument("bulk_load rows repeat a primary key; keys must be unique")
            started = epoch_seconds(self.clock)
            return load_sorted(self.root, data, key_columns, self._options.target_file_rows,
                               to_micros(self.clock.now()), started, self.clock)

    def lookup(self, keys: list[tuple[Any, ...]]) -> dict[tuple[Any, ...], dict[str, Any]]:
        """The fresh rows (pending changes merged) of `keys`; absent keys are left out.
        Reads only the ranges holding those keys, plus the pending changes."""
        if not keys:
            return {}
        schema, key_columns = self.schema, self.primary_key
        columns = {k: [key[i] for key in keys] for i, k in enumerate(key_columns)}
        wanted_table = pa.Table.from_pydict(
            columns, schema=pa.schema([schema.field(k) for k in key_columns]))
        wanted = key_array(wanted_table, key_columns)
        plan = self._plan(to_micros(self.clock.now()), only_keys=wanted)
        manifest = plan.manifest
        lows = [f.low for f in manifest.files]
        indexes = {assign(lows, tuple(k)) for k in keys} if manifest.files else set()
        found: dict[tuple[Any, ...], dict[str, Any]] = {}
        for index in indexes | set(plan.touched):
            if index in plan.touched:
                data = plan.touched[index][0]
            else:
                data = read_file(self.root, manifest.files[index], schema, key_columns)[0]
            data = data.filter(pc.is_in(key_array(data, key_columns), value_set=wanted))
            for row in data.to_pylist():
                found[tuple(row[k] for k in key_columns)] = row
        return found

    def delete_older_than(self, sequence: str) -> int:
        """DELETE, with `sequence` as their _CHANGE_SEQUENCE_NUMBER, the rows whose latest
        change is older than `sequence` (AP-4 order, pending changes merged); return how many.

        After a full backfill of the table that began at `sequence` these are the rows the
        source no longer has: every row it has was written again. A later change of such a
        key still wins, and running this twice deletes nothing more."""
        bound = sort_key_of(sequence)
        plan = self._plan(to_micros(self.clock.now()))
        manifest = plan.manifest
        stale = []
        for index in sorted(set(range(len(manifest.files))) | set(plan.touched)):
            state = (plan.touched[index][1] if index in plan.touched else
                     read_file(self.root, manifest.files[index], self.schema,
                               self.primary_key)[1])
            older = pc.and_(pc.is_null(state.column("_deleted_at")),
                            pc.less(state.column("_seq_key"), bound))
            stale.append(state.filter(older).select(list(self.primary_key)))
        if not stale or not sum(t.num_rows for t in stale):
            return 0
        keys = pa.concat_tables(stale)
        deletes = keys.append_column(pending.CHANGE_TYPE, pa.array(
            ["DELETE"] * keys.num_rows, pa.string())).append_column(
            pending.SEQUENCE, pa.array([sequence] * keys.num_rows, pa.string()))
        self.connection().append(deletes)
        return int(keys.num_rows)

    def to_spark(self, spark: Any) -> Any:
        """A Spark DataFrame of `to_arrow()`'s view (baseline files read by Spark directly)."""
        if self.is_within_staleness() or not self.has_pending_changes():
            table = newest(self.root)
            uris = table.file_uris()
            if uris and not any(f.merge_on_read for f in newest_manifest(self.root).files):
                return spark.read.parquet(*uris)
        return spark.createDataFrame(self.to_arrow())

    def export(self, destination: str | Path, apply_first: bool = True) -> int:
        """Write the table to one Parquet file (AP-9): pending changes are applied first, or,
        with apply_first=False, their presence is an error. Returns the row count."""
        if self.has_pending_changes():
            if not apply_first:
                raise FailedPrecondition(
                    f"table {self.root} has unapplied changes; apply them or pass apply_first"
                )
            self.apply()
        table = self._baseline()
        pq.write_table(table, destination)
        return int(table.num_rows)

    # ---- AP-8 -----------------------------------------------------------------------------

    def apply_jobs(self) -> list[dict[str, Any]]:
        """Apply job history, newest first, with durations."""
        jobs = []
        for entry in DeltaTable(str(self.root)).history():
            if entry.get(JOB):
                jobs.append(json.loads(entry[JOB]) | {"version": entry["version"]})
        return jobs

    def recommended_max_staleness(
        self, tolerated: timedelta = timedelta(0), buffer: timedelta = timedelta(minutes=7)
    ) -> timedelta:
        """AP-8: the larger of the tolerated staleness and twice the p95 apply duration plus a
        buffer (the seed's query adds 7 minutes)."""
        durations = sorted(j["duration_seconds"] for j in self.apply_jobs())
        if not durations:
            return max(tolerated, buffer)
        p95 = durations[min(len(durations) - 1, math.ceil(0.95 * len(durations)) - 1)]
        return max(tolerated, timedelta(seconds=2 * p95) + buffer)


def assign(lows: list[tuple[Any, ...]], key: tuple[Any, ...]) -> int:
    """Index of the range holding `key`: the last range whose lowest key is <= key."""
    return max(0, bisect.bisect_right(lows, key) - 1)
