"""The short fault campaign (issue 14; `bench/faults.py` runs the long one): every kind of
fault, injected while mixed workloads with primary-key updates (and partition churn on the
embedded side) stream from the embedded database and from PostgreSQL into CDC tables and
event files; each mended as a user would. At the end, each stream drained and checked by
`cdcflow verify`: nothing lost, nothing duplicated.

12 or more faults of every kind that needs no new JVM: the full disk, the read-only folder,
the killed capture worker, the restarted PostgreSQL server (one of the last two lands during
each of the others). (20 of each made this test 467 s, a third of the suite's budget; 12 keep
every kind and every pairing, and `bench/faults.py` runs them by the hundred.) The three kinds
that kill `cdcflow run` with its JVM get RUNNER_KILLS each, spread among the others: each
costs a JVM start (about 12 s of this 2-core machine's time, with a runner in standby too: 24
of them took the campaign from 457 to 694 s), so `bench/faults.py` runs them by the hundred,
with and without a standby."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdcflow.faultkit import Campaign, run_campaign
from cdcflow.faultkit_pg import PG_KINDS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]
EACH = 12
RUNNER_KILLS = 4
COUNTS = {"kill-runner": RUNNER_KILLS, "kill-mid-apply": RUNNER_KILLS,
          "kill-mid-events": RUNNER_KILLS, "disk-full": EACH, "read-only": EACH}


def test_a_short_fault_campaign_loses_and_duplicates_nothing(tmp_path: Path):
    result = run_campaign(Campaign(tmp_path, counts=COUNTS, seed=3, postgres=True))
    assert {kind: result["faults"][kind] for kind in COUNTS} == COUNTS
    assert all(result["faults"][kind] >= EACH for kind in PG_KINDS), result["faults"]
    assert result["verify_equal"], result["verify"]
    assert (result["changes_lost"], result["changes_duplicated"]) == (0, 0), result
    assert result["duplicate_event_uuids"] == 0
    assert result["changes_committed"] > 1000 and result["transactions_committed"] > 0
