"""The short fault campaign (issue 14; `bench/faults.py` runs the long one): every kind of
fault that runs here, injected while a mixed workload with primary-key updates and partition
churn streams into a CDC table and event files; each mended as a user would. At the end,
drained and checked by `cdcflow verify`: nothing lost, nothing duplicated."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdcflow.faultkit import KINDS, Campaign, run_campaign

pytestmark = pytest.mark.integration


def test_a_short_fault_campaign_loses_and_duplicates_nothing(tmp_path: Path):
    result = run_campaign(Campaign(tmp_path, faults=len(KINDS) * 2, seed=3))
    assert result["faults"] == {kind: 2 for kind in KINDS}
    assert result["verify_equal"], result["verify"]
    assert (result["changes_lost"], result["changes_duplicated"]) == (0, 0), result
    assert result["duplicate_event_uuids"] == 0
    assert result["changes_committed"] > 100 and result["transactions_committed"] > 0
