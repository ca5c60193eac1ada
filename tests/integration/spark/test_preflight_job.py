"""The storage-root probe on a real Spark session (issue 15): a root every task reaches
passes; a probe whose Spark job itself fails (here: cancelled, as a lost executor would fail
it) gives no verdict on the root, so it is Unavailable, which the runner retries, never
FailedPrecondition, which ends the stream at once."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from cdcflow.errors import FailedPrecondition, Unavailable
from cdcflow.spark.preflight import check_storage_root

pytestmark = pytest.mark.integration


def test_a_root_every_task_reaches_passes_and_leaves_nothing(spark, tmp_path: Path):
    check_storage_root(spark, str(tmp_path / "root"))
    assert list((tmp_path / "root").iterdir()) == []


def test_a_probe_whose_job_fails_is_unavailable_not_a_verdict(spark, tmp_path: Path):
    context = spark.sparkContext
    stop = threading.Event()

    def cancel_every_job() -> None:
        while not stop.is_set():
            context.cancelAllJobs()

    canceller = threading.Thread(target=cancel_every_job, daemon=True)
    canceller.start()
    failures: list[Exception] = []
    try:
        for _ in range(50):  # a probe may finish between two cancellations
            try:
                check_storage_root(spark, str(tmp_path / "root"))
            except (Unavailable, FailedPrecondition) as error:
                failures.append(error)
            if len(failures) >= 3:
                break
    finally:
        stop.set()
        canceller.join(30)
    assert failures, "no probe job was cancelled"
    assert all(type(f) is Unavailable for f in failures), failures
    assert "could not run on the executors" in str(failures[0])
    assert "cancelled" in str(failures[0]).lower(), failures[0]
    check_storage_root(spark, str(tmp_path / "root"))  # the session probes again
