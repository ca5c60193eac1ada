"""A streaming query from the "cdcflow" source into a sink that is idempotent per batch id.

Usage: python stream_job.py DATABASE CHECKPOINT SINK_DIR (processing|availableNow) [SLOW]
Each batch becomes SINK_DIR/batch-<id>.json, written atomically (temp file + rename) and
skipped when it exists; SINK_DIR/started-<id> marks that a batch began. SLOW sleeps before
writing, so a test can kill the process mid-batch.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from cdcflow.spark import session


def main() -> None:
    database, checkpoint, sink, mode = sys.argv[1:5]
    slow = len(sys.argv) > 5
    out = Path(sink)
    out.mkdir(parents=True, exist_ok=True)
    spark = session("cdcflow-stream-job", master="local[2]")
    spark.sparkContext.setLogLevel("ERROR")

    def write_batch(frame, batch_id: int) -> None:
        target = out / f"batch-{batch_id:06d}.json"
        if target.exists():
            return
        (out / f"started-{batch_id:06d}").touch()
        rows = [r.asDict() for r in frame.collect()]
        for row in rows:
            row["commit_timestamp"] = row["commit_timestamp"].isoformat()
            row["source_timestamp"] = row["source_timestamp"].isoformat()
        if slow:
            time.sleep(1.5)
        temporary = out / f".batch-{batch_id:06d}.tmp"
        temporary.write_text(json.dumps(rows))
        os.replace(temporary, target)

    frame = (spark.readStream.format("cdcflow").option("database", database)
             .option("stream", "Everything").option("startingTimestamp", "earliest")
             .option("maxRecordsPerTrigger", 400).load())
    writer = frame.writeStream.foreachBatch(write_batch).option("checkpointLocation", checkpoint)
    if mode == "availableNow":
        writer.trigger(availableNow=True).start().awaitTermination()
    else:
        writer.trigger(processingTime="300 milliseconds").start().awaitTermination()


if __name__ == "__main__":
    main()
