"""A standby runner's warm-up (`cdcflow.streams.warmup`): one throwaway stream, end to end,
in a temporary folder that is gone afterwards, leaving no query running."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from cdcflow.errors import Unavailable
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.lease import RunnerLease
from cdcflow.streams.warmup import (
    PREFIX,
    StandbyWarmUp,
    remove_left_behind,
    warm_standby,
    warm_up,
)

pytestmark = pytest.mark.integration


def _leftovers() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("cdcflow-warm-up-*")}


def test_the_warm_up_writes_its_rows_and_leaves_nothing_behind(spark):
    before = _leftovers()
    written = warm_up(spark)
    assert written["rows"] == 2 and written["seconds"] > 0
    assert spark.streams.active == [] and _leftovers() == before


def test_a_warm_up_that_runs_out_of_time_stops_its_query(spark):
    before = _leftovers()
    with pytest.raises(Unavailable, match="wrote no batch within 0 s"):
        warm_up(spark, seconds=0.0)
    assert spark.streams.active == [] and _leftovers() == before


def test_a_standby_warms_up_only_on_a_local_master(spark):
    assert warm_standby(spark, "spark://127.0.0.1:7077") == {
        "skipped": "the master 'spark://127.0.0.1:7077' is not local"}
    assert warm_standby(None, "local[2]") == {"skipped": "no Spark session"}
    assert warm_standby(spark, "local[2]")["rows"] == 2


def test_a_standby_is_not_eager_for_a_dead_holders_lease_until_it_is_warm(spark,
                                                                         tmp_path: Path):
    lease = RunnerLease(Catalog(tmp_path / "c.db"))
    standby = StandbyWarmUp(spark, "local[2]", lease)
    standby.start()
    assert not lease.eager and standby.result is None  # a warm-up takes seconds
    deadline = time.monotonic() + 120
    while standby.result is None:
        assert time.monotonic() < deadline, "the warm-up never ended"
        time.sleep(0.05)
    assert standby.result["rows"] == 2 and lease.eager
    standby.start()  # once only
    assert lease.eager


def test_folders_of_warm_ups_whose_process_is_gone_are_removed(tmp_path: Path):
    """A warm-up killed mid-way leaves its folder; the next one removes it, not a live one's."""
    child = subprocess.Popen(["sleep", "60"])
    child.kill()
    child.wait()
    root = Path(tempfile.gettempdir())
    dead, alive = root / f"{PREFIX}{child.pid}-abc", root / f"{PREFIX}{os.getpid()}-abc"
    for folder in (dead, alive):
        (folder / "checkpoint").mkdir(parents=True)
    try:
        assert dead.name in remove_left_behind()
        assert not dead.exists() and alive.exists()
    finally:
        shutil.rmtree(alive, ignore_errors=True)
