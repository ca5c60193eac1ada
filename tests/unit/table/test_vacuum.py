"""Vacuum (AP-5's background apply, kept from filling the disk): the files no version in use
within the retention names are deleted, and nothing any such version reads; reads before and
after are the same, to cdcflow and to a third-party Delta reader."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from cdcflow import FakeClock
from cdcflow.errors import InvalidArgument, Unavailable
from cdcflow.streams.applier import Applier
from cdcflow.streams.definition import CdcTableDestination
from cdcflow.table import CdcTable
from cdcflow.table.layout import FileEntry, read_manifest
from cdcflow.table.pending import (
    commit_pending_files,
    ingest_stamp,
    pending_path,
    prepare,
    write_pending_file,
)

pytestmark = pytest.mark.unit
SCHEMA = "id INT64 NOT NULL, v INT64"
HOUR = timedelta(hours=1)


def make_table(path: Path, clock: FakeClock, vectors: bool) -> CdcTable:
    """Ranges of 40 rows; with vectors, two of 10,000 loaded first (a range takes vectors
    from `patching.MIN_BASE_ROWS` rows on)."""
    table = CdcTable.create(path, SCHEMA, ["id"], target_file_rows=10_000 if vectors else 40,
                            clock=clock, deletion_vectors=vectors)
    if vectors:
        table.bulk_load(pa.table({"id": pa.array(range(20_000), pa.int64()),
                                  "v": pa.array([0] * 20_000, pa.int64())}))
    return table


def churn(table: CdcTable, rounds: int, rng: random.Random, clock: FakeClock,
          size: int = 30) -> None:
    """Rounds of `size` upserts and deletes over 200 keys, each applied, a minute apart."""
    for _ in range(rounds):
        batch = [{"id": rng.randrange(200), "v": rng.randrange(10**6),
                  "_CHANGE_TYPE": rng.choice(["UPSERT", "UPSERT", "DELETE"])}
                 for _ in range(size)]
        table.connection().append(batch)
        table.apply()
        clock.advance(timedelta(minutes=1))


def on_disk(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")
            if p.is_file() and "_delta_log/0" not in p.as_posix()
            and p.name not in ("table.json", "apply.lock", "_last_checkpoint")}


def named_now(table: CdcTable) -> set[str]:
    """What the newest version reads: its manifest's files and the live pending files."""
    names: set[str] = set()
    for entry in read_manifest(DeltaTable(str(table.root))).files:
        names |= files_of(table.root, entry)
    pending = pa.table(DeltaTable(pending_path(table.root)).get_add_actions(flatten=True))
    return names | {f"_cdcflow/pending/{p}" for p in pending.column("path").to_pylist()}


def files_of(root: Path, entry: FileEntry) -> set[str]:
    names = {entry.data, entry.state}
    if entry.vector is not None:
        names.add(entry.vector.file(root).relative_to(root).as_posix())
    if entry.patch is not None:
        names |= {entry.patch.data, entry.patch.state} - {""}
    return names


def reads(table: CdcTable) -> tuple[list, dict]:
    rows = sorted((r["id"], r["v"]) for r in table.to_arrow().to_pylist())
    return rows, table.lookup([(k,) for k in range(0, 200, 7)])


def leftovers(table: CdcTable) -> set[str]:
    """Files killed writers leave: an uncommitted pending file, write-aside files."""
    made = write_pending_file(str(table.root), pa.table({"id": [1]}))
    for aside in ("data/.part-x.parquet.tmp", "_cdcflow/pending/.part-y.parquet.tmp",
                  "_delta_log/.0123abcd.json.tmp"):
        (table.root / aside).write_bytes(b"half")
    return {f"_cdcflow/pending/{made['path']}", "data/.part-x.parquet.tmp",
            "_cdcflow/pending/.part-y.parquet.tmp", "_delta_log/.0123abcd.json.tmp"}


@pytest.mark.parametrize("vectors", [False, True], ids=["rewrite", "deletion-vectors"])
def test_a_vacuum_deletes_exactly_what_no_version_in_use_names(tmp_path: Path, vectors: bool):
    clock = FakeClock(datetime.now(UTC))
    table = make_table(tmp_path / "t", clock, vectors)
    churn(table, 12, random.Random(7), clock, 4 if vectors else 30)  # few: vectors, not rewrites
    assert vectors == any((table.root / "dv").glob("*.bin"))
    table.connection().append([{"id": 500, "v": 1, "_CHANGE_TYPE": "UPSERT"}])  # left pending
    left = leftovers(table)
    before, files = reads(table), on_disk(table.root)
    assert table.vacuum().files == ()  # all of it written within the hour
    clock.advance(2 * HOUR)
    done = table.vacuum()
    assert set(done.files) == files - named_now(table)
    assert left <= set(done.files)
    assert len(done.files) > 20 and done.bytes > 0
    assert on_disk(table.root) == named_now(table)
    assert reads(table) == before
    assert 500 in DeltaTable(pending_path(table.root)).to_pyarrow_table().column("id").to_pylist()
    table.apply()
    plain = pa.table(QueryBuilder().register("t", DeltaTable(str(table.root))).execute(
        "SELECT id, v FROM t").read_all())  # a third-party reader, of deletion vectors too
    assert sorted(zip(plain.column("id").to_pylist(), plain.column("v").to_pylist(),
                      strict=True)) == before[0]
    assert (500, 1) in before[0]


def test_a_version_current_within_the_retention_keeps_its_files(tmp_path: Path):
    """Superseded 30 minutes after it was committed, a version stays readable for an hour
    after that: its files go only once it stopped being current before the retention."""
    clock = FakeClock(datetime.now(UTC))
    table = make_table(tmp_path / "t", clock, False)
    churn(table, 2, random.Random(3), clock)
    clock.advance(2 * HOUR)
    table.vacuum()
    older = named_now(table)
    clock.advance(timedelta(minutes=30))
    churn(table, 1, random.Random(4), clock)  # supersedes `older`, applies one pending file
    replaced = older - named_now(table)
    applied = {f"_cdcflow/pending/{p}" for p in
               read_manifest(DeltaTable(str(table.root))).applied_pending}
    assert replaced and len(applied) == 1 and not applied & named_now(table)
    clock.advance(timedelta(minutes=40))
    assert not (replaced | applied) & set(table.vacuum().files)
    assert all((table.root / name).exists() for name in replaced | applied)
    clock.advance(timedelta(minutes=30))
    assert replaced | applied <= set(table.vacuum().files)


@pytest.mark.parametrize("retention", [timedelta(minutes=59), timedelta(0)])
def test_a_retention_under_an_hour_is_refused_and_nothing_is_deleted(tmp_path: Path,
                                                                     retention: timedelta):
    clock = FakeClock(datetime.now(UTC))
    table = make_table(tmp_path / "t", clock, False)
    churn(table, 3, random.Random(5), clock)
    clock.advance(2 * HOUR)
    files = on_disk(table.root)
    with pytest.raises(InvalidArgument, match=f"file retention {retention} is shorter than "
                                              "1:00:00"):
        table.vacuum(retention)
    with pytest.raises(InvalidArgument, match="file retention -1 day, 23:59:59 must not be "
                                              "negative"):
        table.vacuum(timedelta(seconds=-1), enforce_retention=False)
    assert on_disk(table.root) == files


def test_file_retention_is_a_table_option_of_at_least_an_hour(tmp_path: Path):
    table = CdcTable.create(tmp_path / "t", SCHEMA, ["id"], file_retention=2 * HOUR)
    assert CdcTable.open(tmp_path / "t").options["file_retention"] == 2 * HOUR
    for bad in (timedelta(minutes=30), timedelta(days=8)):
        with pytest.raises(InvalidArgument, match=f"file_retention {bad} must be from 1:00:00 "
                                                  r"\(.*\) to 7 days, 0:00:00"):
            table.alter(file_retention=bad)
    assert CdcTable.open(tmp_path / "t").options["file_retention"] == 2 * HOUR
    assert CdcTable.create(tmp_path / "u", SCHEMA, ["id"]).options["file_retention"] == HOUR
    for seconds in (60, 8 * 86_400):
        with pytest.raises(ValueError, match="file_retention_seconds"):
            CdcTableDestination(warehouse="w", file_retention_seconds=seconds)


def test_the_runner_s_apply_vacuums_a_table_at_its_first_apply(tmp_path: Path):
    clock = FakeClock(datetime.now(UTC))
    table = make_table(tmp_path / "t", clock, False)
    churn(table, 6, random.Random(6), clock)
    clock.advance(2 * HOUR)
    garbage = on_disk(table.root) - named_now(table)
    assert garbage
    errors: list = []
    applier = Applier(clock, lambda stream, status, creation: None,
                      lambda *failure: errors.append(failure))
    applier.watch("s", {"T": str(table.root)}, 5.0)
    applier.apply_due("s", force=True)
    assert errors == []
    assert on_disk(table.root) == named_now(table)


def test_a_batch_whose_files_a_vacuum_took_is_refused_and_commits_nothing(tmp_path: Path):
    """A batch that took longer than the retention finds its pending file gone: its commit
    is Unavailable (the batch runs again), never a commit of a file no read could follow."""
    table = CdcTable.create(tmp_path / "t", SCHEMA, ["id"])
    rows = prepare(pa.table({"id": [1], "v": [2]}), table.schema, table.primary_key,
                   ingest_stamp(table.clock))  # as a batch's task prepares and writes them
    written = write_pending_file(str(table.root), rows)
    (table.root / "_cdcflow" / "pending" / written["path"]).unlink()  # as a vacuum would
    version = DeltaTable(pending_path(table.root)).version()
    with pytest.raises(Unavailable, match=f"pending file {written['path']} of .* is gone "
                                          "before its commit"):
        commit_pending_files(str(table.root), [written], "app", 0, table.clock)
    assert DeltaTable(pending_path(table.root)).version() == version
    assert table.connection().append([{"id": 1, "v": 3}])  # the table takes batches again
    assert table.to_arrow().to_pylist() == [{"id": 1, "v": 3}]
