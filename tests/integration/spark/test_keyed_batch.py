"""Keyed batches (issue 11): tasks that read the log themselves, each for a share of the keys,
write the same CDC tables and the same events as Spark's repartition of the batch's frame.

Two batches of a log with partial updates and deletes (OLD_AND_NEW_VALUES: a key's first
UPDATE in the second batch is folded onto its row from the first), over partitions split and
merged meanwhile, go through `run_batch` three ways: repartitioned, in 2 shares (local[2])
and in 3; the tables equal the source, and the events are the same, read times too: each
batch's events are read at the time its offset log entry holds, whichever way runs it.
"""

from __future__ import annotations

import json
import multiprocessing
import zlib
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest

from cdcflow import Database, PartitionPolicy
from cdcflow.events.files import EventFileWriter, Rotation
from cdcflow.model.timestamps import format_rfc3339, from_micros, to_micros
from cdcflow.spark import keyed_batch, pipeline
from cdcflow.spark.driver_batch import DriverReader
from cdcflow.spark.keyed_batch import slice_owners
from cdcflow.spark.offsets import StreamOffset
from cdcflow.spark.options import parse_options
from cdcflow.spark.pipeline import BatchPlan, EventsPlan, run_batch
from cdcflow.spark.reading import read_changes
from cdcflow.spark.rows import batch_dicts
from cdcflow.table import CdcTable
from cdcflow.table.pending import PendingLogs
from cdcflow.testing import WORKLOAD_DDL, run_mixed_writer, run_partition_churn, run_writer

pytestmark = pytest.mark.integration
PLANNED_MS = 1_764_000_000_000
"""Batch N's offset log entry says Spark planned it at PLANNED_MS + N."""
POLICY = PartitionPolicy(split_records=60, max_partitions=6, merge_min_age_seconds=0.3,
                         merge_max_records_per_second=40.0, check_interval_seconds=0.1)


def build_log(path: str, churn: bool = True) -> tuple[Database, list[int]]:
    """A log of mixed writes, with churn or over 4 partitions that never split nor merge;
    the micros before it, at its middle and at its end."""
    db = Database.open(path, partition_policy=POLICY if churn else PartitionPolicy(auto=False),
                       initial_partitions=1 if churn else 4)
    db.ddl(WORKLOAD_DDL)
    db.ddl("CREATE CHANGE STREAM Everything FOR ALL "
           "OPTIONS (value_capture_type = 'OLD_AND_NEW_VALUES')")
    start = to_micros(db.current_timestamp())
    churning = multiprocessing.get_context("spawn").Process(
        target=run_partition_churn, args=(path, "Everything", 2.0, 9))
    if churn:
        churning.start()
    history = str(Path(path).with_suffix(".history"))
    run_mixed_writer(path, 11, 150, key_space=60)
    run_writer(path, 21, 60, history, key_space=60)  # Ledger too, with composite keys
    middle = to_micros(db.current_timestamp())
    run_mixed_writer(path, 12, 150, key_space=60)
    run_writer(path, 22, 60, history, key_space=60)
    if churn:
        churning.join(60)
        assert churning.exitcode == 0
        assert len(db.partitions("Everything")) > 2, "no partition was split"
    else:
        assert len(db.partitions("Everything")) == 4
    return db, [start - 1, middle, to_micros(db.current_timestamp())]


def write_offsets(checkpoint: Path, bounds: list[int]) -> None:
    """Spark's offset log of the two batches, as a query writes it before running each."""
    (checkpoint / "offsets").mkdir(parents=True)
    for batch_id, micros in enumerate(bounds):
        (checkpoint / "offsets" / str(batch_id)).write_text("\n".join(
            ["v1", json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": PLANNED_MS + batch_id}),
             json.dumps(StreamOffset(micros, ()).to_dict())]))


def run_two_batches(spark: Any, db: Database, path: str, folder: Path,
                    bounds: list[int], driver_rows: int = 0) -> None:
    """Both batches through `run_batch`; with `driver_rows` 1, the driver counts each
    slice's mods (and leaves the batch, larger, to the executors)."""
    tables = pipeline._embedded_tables(db, "Everything", folder / "warehouse", None,
                                       pipeline.embedded_writer(path, "Everything"))
    plan = BatchPlan("keyed", path, tuple(tables), tables, f"app-{folder.name}",
                     EventsPlan(str(folder / "events"), "json", Rotation()),
                     driver_rows=driver_rows)
    options = {"database": path, "stream": "Everything"}
    write_offsets(folder / "checkpoint", bounds)
    driver = DriverReader(str(folder / "checkpoint"), parse_options(options), driver_rows)
    logs = PendingLogs()
    for batch_id in (1, 2):
        frame = (spark.read.format("cdcflow").options(**options)
                 .option("startingTimestamp", format_rfc3339(from_micros(bounds[batch_id - 1]
                                                                         + 1)))
                 .option("endingTimestamp", format_rfc3339(from_micros(bounds[batch_id])))
                 .load())
        result = run_batch(plan, frame, batch_id, driver, logs)
        assert result["rows"] > 0


def table_rows(folder: Path, name: str) -> list[dict[str, Any]]:
    rows = CdcTable.open(folder / "warehouse" / name).to_arrow().to_pylist()
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def events(folder: Path) -> list[dict[str, Any]]:
    found = []
    for file in EventFileWriter(str(folder / "events"), "keyed").committed_files():
        for line in file.read_text().splitlines():
            found.append(json.loads(line))
    return sorted(found, key=lambda e: e["uuid"])


@pytest.mark.parametrize("churn", [True, False], ids=["churning", "four-stable-partitions"])
def test_shares_write_what_the_repartition_writes(spark, tmp_path: Path, monkeypatch: Any,
                                                 churn: bool):
    """Shares by key hash, and (counted) by whole partitions where no partition starts or
    ends inside the batch: never in a churning log, in both batches over stable ones."""
    path = str(tmp_path / "log.db")
    db, bounds = build_log(path, churn)
    ways = {"repartitioned": (None, 0), "2 shares": (2, 0), "3 shares": (3, 0),
            "2 shares counted": (2, 1), "3 shares counted": (3, 1)}
    chosen: list[int | None] = []
    owned: list[dict[str, int] | None] = []

    def owners(*args: Any) -> dict[str, int] | None:
        owned.append(slice_owners(*args))
        return owned[-1]

    monkeypatch.setattr(keyed_batch, "slice_owners", owners)
    for way, (shares, driver_rows) in ways.items():
        monkeypatch.setattr(pipeline, "share_count",
                            lambda slots, shares=shares: chosen.append(shares) or shares)
        run_two_batches(spark, db, path, tmp_path / way.replace(" ", "-"), bounds, driver_rows)
    assert chosen == [None, None, 2, 2, 3, 3, 2, 2, 3, 3]
    assert owned[:4] == [None] * 4  # not counted: by key hash
    if churn:
        assert owned[4:] == [None] * 4
    else:
        assert None not in owned[4:6], "2 shares over 4 stable partitions were not whole ones"
        assert all(sorted(set(o.values())) == list(range(len(set(o.values())))) for o in
                   owned[4:] if o is not None)
    for name in ("Accounts", "Ledger"):
        source = sorted(db.scan(name), key=lambda r: json.dumps(r, sort_keys=True, default=str))
        assert source
        for way in ways:
            assert table_rows(tmp_path / way.replace(" ", "-"), name) == source, (way, name)
    for way, (shares, _) in ways.items():  # each way's cut is in its files' names
        files = EventFileWriter(str(tmp_path / way.replace(" ", "-") / "events"),
                                "keyed").committed_files()
        cuts = {f.name.split("-")[2] for f in files}
        assert cuts == ({f"keyed{shares}"} if shares else {"hashed4"}), (way, cuts)
    expected = events(tmp_path / "repartitioned")
    logged = {from_micros((PLANNED_MS + b) * 1000).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
              for b in (1, 2)}
    assert {e["read_timestamp"] for e in expected} == logged
    assert len(expected) == len(log_mods(path, tmp_path / "repartitioned" / "checkpoint"))
    for way in list(ways)[1:]:
        assert events(tmp_path / way.replace(" ", "-")) == expected, way


def test_a_share_holds_every_mod_of_its_keys_and_no_other(tmp_path: Path):
    """`mods_of_share`: one share is the batch's rows exactly as `batch_dicts` makes them of
    the source's record batches; more shares split those rows by (table, keys), each row in
    exactly one share, in log order within each."""
    path = str(tmp_path / "log.db")
    _, bounds = build_log(path)
    options = parse_options({"database": path, "stream": "Everything"})
    write_offsets(tmp_path / "checkpoint", bounds)
    pieces = DriverReader(str(tmp_path / "checkpoint"), options, 0).slices(1)
    assert pieces
    everything = log_mods(path, tmp_path / "checkpoint", batches=(1,))
    whole = keyed_batch.mods_of_share(pieces, 0, 1)
    assert whole == everything
    assert [type(v) for m in whole for v in m.values()] == \
        [type(v) for m in everything for v in m.values()]
    assert {m["commit_timestamp"].tzinfo for m in whole} == {UTC}
    position = {identity(m): index for index, m in enumerate(everything)}
    for shares in (2, 3):
        seen = []
        for share in range(shares):
            mine = keyed_batch.mods_of_share(pieces, share, shares)
            assert all(zlib.crc32(f"{r['table_name']}\x00{r['keys']}".encode()) % shares
                       == share for r in mine)
            order = [position[identity(m)] for m in mine]
            assert order == sorted(order), "a share's mods are out of log order"
            assert all(m == everything[position[identity(m)]] for m in mine)
            seen += [identity(m) for m in mine]
        assert sorted(seen) == sorted(position), f"{shares} shares lose or repeat mods"


def identity(mod: dict[str, Any]) -> tuple[Any, ...]:
    return (mod["partition_token"], mod["server_transaction_id"], mod["record_sequence"],
            mod["mod_index"])


def log_mods(path: str, checkpoint: Path, batches: tuple[int, ...] = (1, 2)
             ) -> list[dict[str, Any]]:
    """Every mod of the batches, as the source's rows (read on the driver)."""
    reader = DriverReader(str(checkpoint), parse_options({"database": path,
                                                          "stream": "Everything"}), 0)
    return [row for batch_id in batches for piece in reader.slices(batch_id) or []
            for batch in read_changes(piece) for row in batch_dicts(batch)]


def test_shares_only_for_a_few_task_slots():
    assert keyed_batch.share_count(1) == 1
    assert keyed_batch.share_count(2) == 2
    assert keyed_batch.share_count(keyed_batch.MAX_SHARES) == keyed_batch.MAX_SHARES
    assert keyed_batch.share_count(keyed_batch.MAX_SHARES + 1) is None
