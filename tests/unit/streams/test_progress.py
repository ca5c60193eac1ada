"""A stream's counters after each batch (EV-9's status): rows and batches add up, the lag is
measured from the last commit applied, and only batches with rows give lag samples."""

from __future__ import annotations

import pytest

from cdcflow.streams.progress import LAGS_KEPT, LAGS_SHOWN, count_batch

pytestmark = pytest.mark.unit
SECOND = 1_000_000


def test_batches_add_up_and_the_lag_follows_the_last_commit_applied():
    stats = {"rows_processed": 40, "batches": 2}  # as a restarted runner takes them back
    first = count_batch(stats, {"rows": 10, "seconds": 0.5, "last_micros": 5 * SECOND},
                        7 * SECOND)
    assert first == {"rows_processed": 50, "batches": 3, "lag_seconds": 2.0,
                     "last_applied_commit": 5 * SECOND, "lag_samples": [2.0],
                     "throughput_rows_per_second": 20.0}
    empty = count_batch(stats, {"rows": 0, "seconds": 0.0, "last_micros": None}, 9 * SECOND)
    assert empty["lag_seconds"] == 4.0 and empty["last_applied_commit"] == 5 * SECOND
    assert empty["lag_samples"] == [2.0]  # a batch without rows is no sample
    assert empty["throughput_rows_per_second"] == 0.0 and empty["batches"] == 4


def test_no_lag_before_any_commit_was_applied():
    counted = count_batch({}, {"rows": 0, "seconds": 1.0, "last_micros": None}, SECOND)
    assert counted["lag_seconds"] is None and counted["lag_samples"] == []


def test_lag_samples_are_bounded():
    stats: dict = {}
    for batch in range(LAGS_KEPT + 50):
        shown = count_batch(stats, {"rows": 1, "seconds": 1.0, "last_micros": batch},
                            LAGS_KEPT * 2)["lag_samples"]
    assert len(stats["lags"]) == LAGS_KEPT and len(shown) == LAGS_SHOWN
    assert shown[-1] == (LAGS_KEPT * 2 - (LAGS_KEPT + 49)) / 1e6
