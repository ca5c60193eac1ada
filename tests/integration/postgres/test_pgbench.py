"""pgbench, a workload nobody in the project wrote: the stream starts (backfill plus CDC)
while pgbench runs, and the whole runner is SIGKILLed during the backfill, at the handoff and
while streaming; afterwards every pgbench table equals its CDC table and pgbench_history's
events number exactly its rows. (The long campaign: bench/bench_pgbench_campaign.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from cdcflow.proof import Campaign, pgbench_campaign

pytestmark = pytest.mark.integration


def test_pgbench_with_the_runner_killed_at_random_points(tmp_path: Path):
    campaign = pgbench_campaign(Campaign(tmp_path, scale=1, clients=4, seconds=25, kills=5,
                                         rate=200, seed=7))
    report = campaign.report
    phases = [kill["at"] for kill in campaign.killed]
    assert phases[:2] == ["backfill", "handoff"] and len(phases) == 5
    checks = report["checks"]
    for name in ("public.pgbench_accounts", "public.pgbench_branches",
                 "public.pgbench_tellers"):
        assert checks[name]["equal"], (name, checks[name])
    history = checks["public.pgbench_history"]
    assert history["rows"] > 1000
    assert history["events"] == history["rows"] == history["unique_uuids"], history
