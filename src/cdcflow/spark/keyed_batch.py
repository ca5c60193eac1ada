"""Large micro-batches done by tasks that read the log themselves, each for a share of the keys
(issue 11: throughput).

Spark's way to give each key's mods to one task is to read the batch through the source and
repartition it by (table, keys): every mod then crosses the JVM three times (the source's
Arrow into rows, the shuffle's files, rows into Arrow again for the Python fold), which cost
the executors' JVMs about as much CPU per change as the Python that folds and writes it. A
batch is fully defined by its two offsets in Spark's offset log (`driver_batch`), so instead
`shares` tasks each read every slice of the batch, keep the mods whose (table, keys) falls in
their share (a stable hash, CRC-32), and fold and write those: the same grouping as the
repartition, and no row goes through the JVM. Each task reads the whole batch, so this pays
only for a few shares: with more task slots than `MAX_SHARES` the repartition does the batch.
On a cluster the driver seals the slices' segments first, as the source's planning does.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

from cdcflow.spark.reading import ChangeSlice, change_rows, seal_slices
from cdcflow.spark.rows import row_dicts
from cdcflow.spark.schema import CHANGE_COLUMNS

MAX_SHARES = 4
"""Past this many task slots a batch is repartitioned instead: each share reads the whole batch,
so reading would cost more than the shuffle it saves."""


def share_count(task_slots: int) -> int | None:
    """How many shares a batch is cut into on `task_slots` slots; None: repartition it."""
    if task_slots > MAX_SHARES:
        return None
    return max(task_slots, 1)


def share_of(table_name: str, keys: str, shares: int) -> int:
    """The share of a key: the same for every mod of it, whatever task computes it."""
    return zlib.crc32(f"{table_name}\x00{keys}".encode()) % shares


def mods_of_share(pieces: Sequence[ChangeSlice], share: int, shares: int
                  ) -> list[dict[str, Any]]:
    """The batch's mods (the source's rows, as `batch_dicts` gives them) whose key falls in
    `share`, in log order; the other mods' values are not even encoded."""
    keep = None if shares == 1 else partial(_in_share, share, shares)
    rows = (row for piece in pieces for row in change_rows(piece, keep))
    return row_dicts(rows, CHANGE_COLUMNS)


def _in_share(share: int, shares: int, table_name: str, keys: str) -> bool:
    return share_of(table_name, keys, shares) == share


def run_keyed(spark: Any, pieces: list[ChangeSlice], shares: int,
              work: Any) -> list[dict[str, Any]]:
    """Seal the pieces' segments (a cluster's), then run `work(share, shares, pieces)` for
    each share as one task; what the tasks describe, together."""
    sealed = seal_slices(pieces)
    job = spark.sparkContext.parallelize(range(shares), shares)
    described: list[dict[str, Any]] = job.mapPartitions(
        partial(_run_shares, work, shares, sealed)).collect()
    return described


def _run_shares(work: Any, shares: int, pieces: list[ChangeSlice],
                numbers: Iterator[int]) -> Iterator[dict[str, Any]]:
    for share in numbers:
        yield from work(share, shares, pieces)
