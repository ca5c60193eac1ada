"""The short fault campaign (issue 14; `bench/faults.py` runs the long one): every kind of
fault, injected while mixed workloads with primary-key updates (and partition churn on the
embedded side) stream from the embedded database and from PostgreSQL into CDC tables and
event files; each mended as a user would. At the end, each stream drained and checked by
`cdcflow verify`: nothing lost, nothing duplicated.

EACH (2) of the full disk, the read-only folder, and each of the three kinds that kill
`cdcflow run` with its JVM (spread among the others). Each of these 10 lands with a
PostgreSQL fault for company, the killed capture worker and the restarted server in turn,
so those two get 5 each, and each kind of the 10 meets both. Three more runners stand by,
as a user who wants fast failover would run them: a standby warms up once with a throwaway
stream, and a runner is killed only once one of them is warm, so that each takeover is a
warm standby's (a runner started again that takes over cold is test_runner_crash.py's). The
runner started again stands by in its turn. In whole runs of `make test`, 16 of each took
713 s on one machine (the suite 36 minutes); on another, 8 of each took 357 s (the suite
28.5 minutes, with other work beside it) and 5 of each 221-249 s (the suite 24-26.5
minutes), so the suite ran 3: 127-143 s (the suite 23-25 minutes), and now runs 2. The long
campaign is `bench/faults.py --faults 100 --postgres --standbys 3` (200 faults, 0 lost and 0
duplicated, on 2026-11-29)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdcflow.faultkit import Campaign, run_campaign
from cdcflow.faultkit_pg import PG_KINDS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]
EACH = 2
PG_COUNTS = dict(zip(PG_KINDS, (5, 5), strict=True))  # in turn over the 10 rounds
COUNTS = {"kill-runner": EACH, "kill-mid-apply": EACH, "kill-mid-events": EACH,
          "disk-full": EACH, "read-only": EACH}


def test_a_short_fault_campaign_loses_and_duplicates_nothing(tmp_path: Path):
    result = run_campaign(Campaign(tmp_path, counts=COUNTS, seed=3, postgres=True,
                                   standbys=3))
    assert {kind: result["faults"][kind] for kind in COUNTS} == COUNTS
    assert {kind: result["faults"][kind] for kind in PG_KINDS} == PG_COUNTS, result["faults"]
    assert result["verify_equal"], result["verify"]
    assert (result["changes_lost"], result["changes_duplicated"]) == (0, 0), result
    assert result["duplicate_event_uuids"] == 0
    assert result["changes_committed"] > 1000 and result["transactions_committed"] > 0
