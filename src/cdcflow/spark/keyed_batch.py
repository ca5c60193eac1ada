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

When no partition starts or ends inside the batch, a key's mods in it are all in the one
partition its key routes to, so shares can be whole partitions instead (`slice_owners`): each
task reads only its own slices and keeps every mod of them. The driver balances them by the
mods the log counts per slice, and keeps the key hash when it can't within `BALANCE`.
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


BALANCE = 1.15
"""Whole partitions make the shares only if the largest holds at most this much more than an
even split: a share by key hash reads every slice, but its load is even."""


def slice_owners(pieces: Sequence[ChangeSlice], counts: Sequence[int] | None, shares: int
                 ) -> dict[str, int] | None:
    """The share of each slice's partition, or None: shares by key hash. Only when every
    slice spans the whole batch (no partition starts or ends inside it, so no key moves
    between partitions in it), and the largest share, filled largest slice first into the
    least loaded, stays within BALANCE of an even split."""
    if counts is None or shares < 2 or len({(p.after, p.until) for p in pieces}) != 1:
        return None
    loads = [0] * shares
    owners: dict[str, int] = {}
    for count, piece in sorted(zip(counts, pieces, strict=True), key=lambda pair: -pair[0]):
        owner = loads.index(min(loads))
        owners[piece.token] = owner
        loads[owner] += count
    return owners if max(loads) * shares <= BALANCE * sum(counts) else None


def share_of(table_name: str, keys: str, shares: int) -> int:
    """The share of a key: the same for every mod of it, whatever task computes it."""
    return zlib.crc32(f"{table_name}\x00{keys}".encode()) % shares


def mods_of_share(pieces: Sequence[ChangeSlice], share: int, shares: int,
                  owners: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """The batch's mods (the source's rows, as `batch_dicts` gives them) whose key falls in
    `share`, in log order; the other mods' values are not even encoded. With `owners`
    (`slice_owners`), the mods of the slices whose partition the share owns, all of them."""
    keep = None if shares == 1 or owners is not None else partial(_in_share, share, shares)
    if owners is not None:
        pieces = [piece for piece in pieces if owners[piece.token] == share]
    rows = (row for piece in pieces for row in change_rows(piece, keep))
    return row_dicts(rows, CHANGE_COLUMNS)


def _in_share(share: int, shares: int, table_name: str, keys: str) -> bool:
    return share_of(table_name, keys, shares) == share


def run_keyed(spark: Any, pieces: list[ChangeSlice], shares: int, work: Any,
              counts: list[int] | None = None) -> list[dict[str, Any]]:
    """Seal the pieces' segments (a cluster's), then run `work(share, shares, pieces,
    owners)` for each share as one task (`owners`: `slice_owners` of the pieces and their
    mod `counts`; a sealed piece cut in parts keeps its token); what the tasks describe."""
    owners = slice_owners(pieces, counts, shares)
    sealed = seal_slices(pieces)
    job = spark.sparkContext.parallelize(range(shares), shares)
    described: list[dict[str, Any]] = job.mapPartitions(
        partial(_run_shares, work, shares, sealed, owners)).collect()
    return described


def _run_shares(work: Any, shares: int, pieces: list[ChangeSlice],
                owners: dict[str, int] | None,
                numbers: Iterator[int]) -> Iterator[dict[str, Any]]:
    for share in numbers:
        yield from work(share, shares, pieces, owners)
