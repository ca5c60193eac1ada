"""A job on the public Spark API, run by `spark-submit --master spark://...` (issue 15):
`cdcflow.spark.session()` keeps spark-submit's master, and a batch read of a change stream
and one of a table snapshot (Accounts as of ENDING), both with `segmentRoot`, run on the
executors. Prints the mods per table and the snapshot's rows, sorted, as JSON.

Usage: spark-submit --master URL submitted_job.py DATABASE STREAM SEGMENT_ROOT ENDING
"""

from __future__ import annotations

import json
import sys

from cdcflow.spark import session


def main() -> None:
    database, stream, segments, ending = sys.argv[1:5]
    spark = session("cdcflow-submitted-job")
    counts = (spark.read.format("cdcflow").option("database", database)
              .option("stream", stream).option("segmentRoot", segments)
              .option("startingTimestamp", "earliest").option("endingTimestamp", ending)
              .load().groupBy("table_name").count().collect())
    accounts = (spark.read.format("cdcflow").option("database", database)
                .option("table", "Accounts").option("readTimestamp", ending)
                .option("segmentRoot", segments).load().collect())
    print(json.dumps({"master": spark.sparkContext.master,
                      "counts": {row["table_name"]: row["count"] for row in counts},
                      "accounts": sorted(json.dumps(row.asDict(), sort_keys=True)
                                         for row in accounts)}))
    spark.stop()


if __name__ == "__main__":
    main()
