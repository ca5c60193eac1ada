"""End-to-end Spark throughput from the embedded database into a no-op foreachBatch (issue 3).

Usage: python bench/bench_spark.py [--transactions 25000] [--partitions 1 2 4]
                                   [--checksummed-files]
Expected output: per partition count, mods/s through Spark, mods/s of a plain Python loop over
read_change_stream on the same data, their ratio, the source's planning time per batch, and
the time per batch of Spark's phases (walCommit and commitOffsets log to the checkpoint).
Then the same rate counted over the batches' own time (Spark's triggerExecution), which leaves
out the query's start: about 0.5 s here, most of it the fresh Python process in which
Spark runs a Python streaming source for each query.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from cdcflow import Database, PartitionPolicy
from cdcflow.spark import session


def populate(path: str, transactions: int, partitions: int) -> Database:
    db = Database.open(path, partition_policy=PartitionPolicy(auto=False),
                       initial_partitions=partitions)
    db.ddl("CREATE TABLE T (Id INT64 NOT NULL, V INT64, S STRING(MAX)) PRIMARY KEY (Id)")
    db.ddl("CREATE CHANGE STREAM S FOR ALL")
    for t in range(transactions):
        with db.transaction() as tx:
            for r in range(4):
                tx.insert_or_update("T", {"Id": (t * 4 + r) % 100_000, "V": t, "S": "payload"})
    return db


def python_loop(db: Database) -> tuple[int, float]:
    start = db.partitions("S")[0].start_timestamp
    end = db.current_timestamp()
    began = time.perf_counter()
    mods = 0
    for partition in db.partitions("S"):
        for row in db.read_change_stream("S", start, end, partition.token, 1000):
            if row.data_change_record is not None:
                mods += len(row.data_change_record.mods)
    return mods, time.perf_counter() - began


PHASES = ("latestOffset", "walCommit", "addBatch", "commitOffsets")


def spark_run(spark, path: str, folder: Path, per_batch: int
              ) -> tuple[int, float, float, int, dict[str, float]]:
    counted: list[int] = []

    def sink(frame, _batch_id: int) -> None:
        frame.write.format("noop").mode("overwrite").save()
        counted.append(0)

    began = time.perf_counter()
    query = (spark.readStream.format("cdcflow").option("database", path).option("stream", "S")
             .option("startingTimestamp", "earliest").option("maxRecordsPerTrigger", per_batch)
             .load().writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(folder / f"ckpt-{time.time_ns()}"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    elapsed = time.perf_counter() - began
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    planning = [p["durationMs"].get("latestOffset", 0) + p["durationMs"].get("queryPlanning", 0)
                + p["durationMs"].get("getBatch", 0) for p in progress]
    phases = {name: sum(p["durationMs"].get(name, 0) for p in progress) / max(len(progress), 1)
              for name in PHASES}
    phases["batches"] = sum(p["durationMs"].get("triggerExecution", 0) for p in progress)
    return rows, elapsed, sum(planning) / max(len(planning), 1), len(progress), phases


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--transactions", type=int, default=25_000)
    parser.add_argument("--partitions", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--per-batch", type=int, default=25_000)
    parser.add_argument("--checksummed-files", action="store_true",
                        help="checkpoint through Hadoop's checksummed local file system "
                             "(Spark's default) instead of cdcflow's raw one")
    args = parser.parse_args()
    chosen = {"spark_hadoop_fs_AbstractFileSystem_file_impl": "org.apache.hadoop.fs.local.LocalFs"}
    spark = session("cdcflow-bench", master="local[*]",
                    **(chosen if args.checksummed_files else {}))
    spark.sparkContext.setLogLevel("ERROR")
    print(f"Spark end to end, {args.transactions} transactions x 4 mods, "
          f"maxRecordsPerTrigger={args.per_batch}, {spark.sparkContext.defaultParallelism} cores")
    with tempfile.TemporaryDirectory() as folder:
        for count in args.partitions:
            path = str(Path(folder) / f"p{count}.db")
            db = populate(path, args.transactions, count)
            spark_run(spark, path, Path(folder), args.per_batch)  # warm-up
            rows, elapsed, planning, batches, phases = spark_run(spark, path, Path(folder),
                                                                 args.per_batch)
            mods, loop_seconds = python_loop(db)
            assert rows == mods, (rows, mods)
            spark_rate, loop_rate = rows / elapsed, mods / loop_seconds
            print(f"  {count} partition(s): spark {spark_rate:,.0f} mods/s "
                  f"({batches} batches, planning {planning:.0f} ms/batch); "
                  f"python loop {loop_rate:,.0f} mods/s; ratio spark/loop "
                  f"{spark_rate / loop_rate:.2f}")
            in_batches = rows / (phases.pop("batches") / 1000)
            print("    ms per batch: " + ", ".join(f"{k} {v:.0f}" for k, v in phases.items()))
            print(f"    over its batches alone (without the query's start): {in_batches:,.0f} "
                  f"mods/s, ratio {in_batches / loop_rate:.2f}")
    spark.stop()


if __name__ == "__main__":
    main()
