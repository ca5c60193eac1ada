"""What a stream needs to run: its source, selected objects, tables and batch plan.

Every object gets a CDC table: in the CDC-table destination's warehouse when there is one,
otherwise under `state/<stream>/` beside the catalog (under `spark.storage_root` when set)
as the stream's own row state, because events carry the whole row (EV-5) and partial change
records are folded onto the current row.
An object without a primary key has no table: its changes go to events as they are.
"""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from cdcflow.capture.source import ChangeSource, SourceObject
from cdcflow.events.files import EventFileWriter, Rotation
from cdcflow.spark.pipeline import BatchPlan, EventsPlan
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.definition import CdcTableDestination, EventFilesDestination
from cdcflow.streams.definition import StreamDefinition as Definition
from cdcflow.streams.sources import open_source
from cdcflow.table import CdcTable
from cdcflow.table.arrow_types import arrow_type
from cdcflow.table.metadata import MIN_FILE_RETENTION_SECONDS
from cdcflow.table.writers import TableWriter, claim_tables

DEFAULT_APPLY_SECONDS = 10.0
"""How often the runner applies a table that has no max_staleness."""


@dataclass(slots=True)
class StreamSetup:
    """A stream's source, objects (by name), tables (object -> root) and batch plan.
    `keyless` are the objects a CDC-table destination cannot hold (no primary key, none given
    in the definition): their changes go to event files only."""

    definition: Definition
    source: ChangeSource
    objects: dict[str, SourceObject]
    tables: dict[str, str]
    plan: BatchPlan
    keyless: tuple[str, ...] = ()

    @property
    def apply_seconds(self) -> float:
        """AP-5: apply at least every max_staleness / 2."""
        destination = cdc_destination(self.definition)
        staleness = None if destination is None else destination.max_staleness_seconds
        return DEFAULT_APPLY_SECONDS if staleness is None else staleness / 2


def cdc_destination(definition: Definition) -> CdcTableDestination | None:
    found = [d for d in definition.destinations if isinstance(d, CdcTableDestination)]
    return found[0] if found else None


def events_plan(definition: Definition) -> EventsPlan | None:
    found = [d for d in definition.destinations if isinstance(d, EventFilesDestination)]
    if not found:
        return None
    first = found[0]
    return EventsPlan(os.path.abspath(first.root), first.format,
                      Rotation(first.max_events, first.max_bytes, first.max_seconds))


def table_schema(item: SourceObject) -> pa.Schema:
    return pa.schema([pa.field(c.name, arrow_type(c.type), c.nullable or
                               c.key_position is None) for c in item.columns])


def ensure_tables(definition: Definition, objects: list[SourceObject],
                  home: Path, catalog: Catalog | None = None) -> dict[str, str]:
    """A CDC table per keyed object, created if missing, each claimed by the stream of
    `catalog` (`table_writer`); object -> resolved root."""
    destination = cdc_destination(definition)
    if destination is None:
        folder, staleness, retention = state_folder(definition, home), None, 2 * 86_400.0
        files_kept = MIN_FILE_RETENTION_SECONDS
    else:
        folder = Path(destination.warehouse)
        staleness, retention = (destination.max_staleness_seconds,
                                destination.delete_retention_seconds)
        files_kept = destination.file_retention_seconds
    roots: dict[str, str] = {}
    keyed = [item for item in objects if item.primary_key]
    writer = table_writer(definition, catalog)
    claim_tables(writer, {item.name: folder / item.name for item in keyed})
    for item in keyed:  # one claimed folder each: two names of one folder are refused
        table = CdcTable.ensure(
            folder / item.name, table_schema(item), list(item.primary_key),
            max_staleness=None if staleness is None else timedelta(seconds=staleness),
            delete_retention=timedelta(seconds=retention),
            file_retention=timedelta(seconds=files_kept))
        roots[item.name] = str(table.root.resolve())
    return roots


TABLE_REMEDY = ("give one of the streams a warehouse of its own, or leave the object out "
                "of one (its include and exclude)")


def state_folder(definition: Definition, home: Path) -> Path:
    """Where a stream without a CDC-table destination keeps its objects' rows."""
    return Path(definition.spark.storage_root or home) / "state" / definition.name


def table_writer(definition: Definition, catalog: Catalog | None = None) -> TableWriter:
    """The stream as the writer of its CDC tables: its name and its catalog's identity, so
    that two catalogs' streams of one name are two writers. A claim recorded
    by the app id alone (an earlier cdcflow's) is the stream's, and becomes its catalog's.
    Without a catalog (a benchmark's stream, say), the app id alone."""
    if catalog is None:
        return TableWriter(app_id(definition), f"stream {definition.name!r}", TABLE_REMEDY)
    return TableWriter(f"{app_id(definition)}@catalog:{catalog.identity}",
                       f"stream {definition.name!r} of the catalog "
                       f"'{os.path.abspath(catalog.path)}'", TABLE_REMEDY,
                       legacy=app_id(definition))


def app_id(definition: Definition) -> str:
    return f"stream:{definition.name}"


def prepare_stream(definition: Definition, home: Path,
                   catalog: Catalog | None = None) -> StreamSetup:
    """Open the source, select its objects, create their tables (claimed by the stream of
    `catalog`), and plan the batches."""
    source = open_source(definition, home)
    objects = {o.name: o for o in source.discover() if definition.selects(o.name)}
    tables = ensure_tables(definition, list(objects.values()), home, catalog)
    label = source.log_location()[0]
    plan = BatchPlan(definition.name, label, tuple(objects), tables,
                     app_id(definition), events_plan(definition),
                     definition.spark.driver_batch_rows)
    keyless = tuple(sorted(o for o in objects if o not in tables)) \
        if cdc_destination(definition) is not None else ()
    return StreamSetup(definition, source, objects, tables, plan, keyless)


APP_ID, FIRST_EVENT_BATCH = "app_id", "first_event_batch"
"""Status keys: the app id a stream's CDC-table commits carry (a stream from before these
keys: `app_id(definition)`), and the number its Spark batch 0 has in its event manifests."""


def start_afresh(definition: Definition, home: Path, catalog: Catalog) -> None:
    """A stream's first start, and only that (no CDC start, no app id in its status), sweeps
    what an earlier stream of its name left, before the stream's tables are made: its Spark
    checkpoint (offsets of another source) and control file, and, without a CDC-table
    destination and before any backfill, the row state of every object it kept (another
    source's rows). It records an app id of its own, which no batch in a table carries, and
    numbers its event batches on from the manifests under its name, so that none of its
    batches is taken for an earlier one's and skipped."""
    status = catalog.status(definition.name)
    if "cdc_start" in status or APP_ID in status:
        return
    _remove(home / "checkpoints" / definition.name)
    _remove(home / "checkpoints" / f"{definition.name}.control")
    if cdc_destination(definition) is None and "backfill" not in status:
        claims = table_writer(definition, catalog)
        folder = state_folder(definition, home)
        for root in sorted(folder.iterdir()) if folder.is_dir() else []:
            if claims.holds(root):  # not another catalog's (one storage root for both)
                _remove(root)
    events = events_plan(definition)
    last_event = (None if events is None else
                  EventFileWriter(events.root, definition.name).last_batch())
    catalog.update_status(definition.name, **{
        APP_ID: f"{app_id(definition)}#{secrets.token_hex(8)}",
        FIRST_EVENT_BATCH: 0 if last_event is None else last_event + 1})


def _remove(path: Path) -> None:
    """`path` gone, whether a folder or a file; any error is raised while part of it is
    there."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        if path.exists() or path.is_symlink():
            raise


def as_recorded(plan: BatchPlan, status: dict[str, Any]) -> BatchPlan:
    """`plan` with the app id and the first event batch that `start_afresh` recorded."""
    return replace(plan, app_id=str(status.get(APP_ID, plan.app_id)),
                   first_event_batch=int(status.get(FIRST_EVENT_BATCH, 0)))
