"""Where a stream's work goes when its Spark master is a standalone cluster (issue 15).

Executors on other machines can't open the driver's files: the change log, the catalog, or
a destination on a local disk. On a cluster a stream needs `spark.storage_root`, a folder
that every machine mounts at the same path. Its destinations must lie under it; the stream's
log segments (`cdcflow.store.segments`) and its own row state go there too. This is checked
before the stream's first batch, with an error that names what is wrong.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cdcflow.errors import FailedPrecondition, InvalidArgument
from cdcflow.spark.master import standalone_addresses
from cdcflow.streams.definition import CdcTableDestination
from cdcflow.streams.definition import StreamDefinition as Definition


@dataclass(frozen=True, slots=True)
class ClusterPlacement:
    """A stream's shared folders on a cluster."""

    storage_root: str
    segment_root: str


def check_master_of(definition: Definition, master: str, master_given: bool) -> None:
    """A definition that names a cluster must run on it, unless `cdcflow run --master`
    overrides every definition's. (A local master runs in any session: local masters differ
    only in their thread counts.)"""
    wanted = definition.spark.master
    if not master_given and standalone_addresses(wanted) and wanted != master:
        raise FailedPrecondition(
            f"stream {definition.name!r} names Spark master {wanted!r}, but this runner's "
            f"session is on {master!r}: run it with `cdcflow run --master {wanted}`")


def destination_paths(definition: Definition) -> list[str]:
    """Every folder executors write for the stream: its warehouse and its event files, made
    absolute on the driver (symbolic links kept: a mount point may be one)."""
    return [os.path.abspath(d.warehouse if isinstance(d, CdcTableDestination) else d.root)
            for d in definition.destinations]


def cluster_placement(definition: Definition, master: str, home: Path
                      ) -> ClusterPlacement | None:
    """None on a local master; else the stream's shared folders, after checking that it has a
    storage root and that every destination lies under it. The segments' folder is named by
    the stream and its catalog's folder (`home`): queries never share one."""
    if not standalone_addresses(master):
        return None
    root = definition.spark.storage_root
    if root is None:
        raise FailedPrecondition(
            f"stream {definition.name!r} runs on Spark master {master!r}, whose executors "
            "can't open this machine's files: set spark.storage_root to a folder every "
            "machine mounts at the same path, and put the destinations under it")
    shared = Path(os.path.abspath(root))
    outside = [path for path in destination_paths(definition)
               if not Path(path).is_relative_to(shared)]
    if outside:
        raise FailedPrecondition(
            f"stream {definition.name!r}: {outside} are not under spark.storage_root "
            f"{root!r}, so executors on other machines can't write them")
    catalog = hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:10]
    return ClusterPlacement(str(shared), str(shared / "segments" /
                                             f"{definition.name}-{catalog}"))


def master_of_streams(definitions: list[Definition]) -> str:
    """The master a runner without --master uses: the cluster the definitions name (local[*]
    when none names one); InvalidArgument, naming them, when they name more than one master
    (local ones count as one: local masters differ only in their thread counts)."""
    named: dict[str, list[str]] = {}
    for definition in definitions:
        master = definition.spark.master
        key = master if standalone_addresses(master) else "local"
        named.setdefault(key, []).append(definition.name)
    if len(named) > 1:
        listed = "; ".join(f"{master}: {', '.join(names)}" for master, names in named.items())
        raise InvalidArgument(
            f"the catalog's streams name different Spark masters ({listed}): one runner has "
            "one session; give --master, or keep those streams in separate catalogs")
    return next((master for master in named if master != "local"), "local[*]")
