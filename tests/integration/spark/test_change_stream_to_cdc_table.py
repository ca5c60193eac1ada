"""Change stream into CDC tables end to end in Spark (issue 4, test 6): a random workload with
partial updates (OLD_AND_NEW_VALUES carries only written columns), partitions splitting and
merging; the final CDC table equals the source table, and the Spark sink is exactly once."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from cdcflow import Database, PartitionPolicy
from cdcflow.errors import InvalidArgument
from cdcflow.spark import append_frame, apply_change_stream, cdc_table_sink
from cdcflow.table import CdcTable
from cdcflow.testing import WORKLOAD_DDL, run_mixed_writer, run_partition_churn

pytestmark = pytest.mark.integration


def test_change_stream_into_cdc_tables_equals_the_source(spark, tmp_path: Path):
    path = str(tmp_path / "src.db")
    db = Database.open(path, partition_policy=PartitionPolicy(
        split_records=100, max_partitions=6, merge_min_age_seconds=0.5,
        merge_max_records_per_second=20.0, check_interval_seconds=0.2))
    db.ddl(WORKLOAD_DDL)
    db.ddl("CREATE CHANGE STREAM Everything FOR ALL "
           "OPTIONS (value_capture_type = 'OLD_AND_NEW_VALUES')")
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=run_mixed_writer, args=(path, s, 300)) for s in (1, 2)]
    processes.append(context.Process(target=run_partition_churn,
                                     args=(path, "Everything", 3.0, 4)))
    for process in processes:
        process.start()
    warehouse = tmp_path / "warehouse"
    query = apply_change_stream(spark, path, "Everything", warehouse, tmp_path / "ckpt",
                                trigger={"processingTime": "200 milliseconds"})
    try:
        for process in processes:
            process.join(timeout=300)
            assert process.exitcode == 0
        final = db.current_timestamp()
        accounts = CdcTable.open(warehouse / "Accounts")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            progress = query.lastProgress
            end = progress and progress["sources"][0]["endOffset"]
            if end and '"timestamp": ' in end and int(
                    end.split('"timestamp": ')[1].split(",")[0]) >= int(final.timestamp() * 1e6):
                break
            time.sleep(0.5)
        else:
            pytest.fail("the pipeline did not catch up")
    finally:
        query.stop()
    source = {r["Id"]: r for r in db.scan("Accounts")}
    merged = {r["Id"]: r for r in accounts.to_arrow().to_pylist()}
    assert merged == source
    accounts.apply()
    assert {r["Id"]: r for r in accounts.to_arrow().to_pylist()} == source
    assert len(source) > 20
    assert sum(len(p.parent_tokens) == 2 for p in db.partitions("Everything")) >= 1


def test_spark_sink_is_exactly_once_per_batch_id(spark, tmp_path: Path):
    table = CdcTable.create(tmp_path / "t", "id INT64 NOT NULL, v INT64", ["id"])
    frame = spark.createDataFrame(
        [(i, i * 10, "UPSERT", f"{i:x}") for i in range(50)],
        "id BIGINT, v BIGINT, _CHANGE_TYPE STRING, _CHANGE_SEQUENCE_NUMBER STRING",
    ).repartition(3)
    sink = cdc_table_sink(tmp_path / "t")
    sink(frame, 0)
    sink(frame, 0)  # a replayed batch
    deletes = spark.createDataFrame(
        [(3, "DELETE", "ff")], "id BIGINT, _CHANGE_TYPE STRING, _CHANGE_SEQUENCE_NUMBER STRING")
    sink(deletes, 1)
    rows = table.to_arrow().to_pylist()
    assert len(rows) == 49 and {r["id"] for r in rows} == set(range(50)) - {3}
    pending = spark.read.parquet(*[str(p) for p in (tmp_path / "t/_cdcflow/pending").glob(
        "part-*.parquet")])
    assert pending.count() == 50 + 1  # the replayed batch wrote nothing at all
    bad = spark.createDataFrame([(1, "INSERT")], "id BIGINT, _CHANGE_TYPE STRING")
    with pytest.raises(Exception, match="not a valid CHANGE_TYPE"):
        sink(bad, 2)


def test_a_connection_takes_a_spark_dataframe_through_append_frame(spark, tmp_path: Path):
    table = CdcTable.create(tmp_path / "t", "id INT64 NOT NULL, v INT64", ["id"])
    connection = table.connection()
    frame = spark.createDataFrame([(i, i, "UPSERT") for i in range(20)],
                                  "id BIGINT, v BIGINT, _CHANGE_TYPE STRING").repartition(2)
    assert append_frame(connection, frame, app_id="loader", version=1)
    assert not append_frame(connection, frame, app_id="loader", version=1)  # a retry
    assert sorted(r["id"] for r in table.to_arrow().to_pylist()) == list(range(20))
    assert len(list((tmp_path / "t/_cdcflow/pending").glob("part-*.parquet"))) >= 2
    plain = spark.createDataFrame([(99, 1)], "id BIGINT, v BIGINT")
    with pytest.raises(Exception, match="not a valid CHANGE_TYPE"):
        append_frame(connection, plain)
    with pytest.raises(InvalidArgument, match="append_frame"):
        connection.append(plain)  # table/ takes no Spark frames itself
    assert len(table.to_arrow()) == 20
