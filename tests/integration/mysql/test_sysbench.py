"""sysbench, a workload nobody in the project wrote, against the MySQL/MariaDB source: the
stream starts (backfill of the sbtest tables, then binlog CDC) while `sysbench
oltp_read_write` runs with 4 threads for 40 s, and the whole runner is SIGKILLed during the
backfill, at the handoff to CDC and while streaming; afterwards the capture has reached the
server's binlog position and every sbtest table equals its CDC table (checksums over rows
sorted by key). sysbench runs at 100 transactions a second so that the runner's restarts
and the catch-up fit a 2-core machine. (The long campaign: bench/bench_sysbench_campaign.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cdcflow.proof_sysbench import SysbenchCampaign, compare_rows, sysbench_campaign

pytestmark = pytest.mark.integration


def test_sysbench_with_the_runner_killed_at_random_points(tmp_path: Path):
    report = sysbench_campaign(SysbenchCampaign(tmp_path, tables=4, table_size=10_000,
                                                threads=4, seconds=40, kills=3, rate=100,
                                                seed=11))
    kills = report["kills"]
    assert [kill["at"] for kill in kills] == ["backfill", "handoff", "streaming 1"], kills
    assert kills[0]["state"] == "STARTING" and kills[0]["sysbench_running"], kills[0]
    assert kills[1]["state"] == kills[2]["state"] == "RUNNING", kills
    assert report["sysbench"]["transactions"] > 2_000, report["sysbench"]  # 100/s for 40 s
    assert report["sysbench"]["writes"] > 8_000, report["sysbench"]
    binlog = report["binlog"]
    assert binlog["cdc_transactions"] > 2_000, binlog  # after the snapshot: through the binlog
    assert report["status"]["rows_processed"] > 8_000, report["status"]  # 4 rows a transaction
    assert binlog["captured"]["log_file"] == binlog["server"]["log_file"]
    assert binlog["captured"]["log_position"] >= binlog["server"]["log_position"], binlog
    checks = report["checks"]
    assert sorted(checks) == [f"sbtest.sbtest{n}" for n in range(1, 5)]
    for name, check in checks.items():
        assert check["rows"] > 0 and check["equal"], (name, check)
    assert report["password_in_files"] == []


def test_the_comparison_finds_a_dropped_a_doubled_and_a_stale_change():
    source = [{"id": i, "k": i * 7, "c": f"c{i}", "pad": "p"} for i in range(1, 6)]
    assert compare_rows(source, list(reversed(source)))["equal"]
    dropped_insert = source[:-1]
    stale_update = [*source[:2], source[2] | {"k": 0}, *source[3:]]
    missed_delete = [*source, {"id": 9, "k": 1, "c": "gone", "pad": "p"}]
    doubled = [*source, source[0]]
    found = [compare_rows(source, copy) for copy in (dropped_insert, stale_update,
                                                     missed_delete, doubled)]
    assert not any(check["equal"] for check in found)
    assert found[0]["missing"] == [5] and found[2]["extra"] == [9]
    assert found[1]["different"] == [{"source": source[2], "cdc": source[2] | {"k": 0}}]
    assert found[3]["cdc_rows"] == 6 and found[3]["checksum"] != found[3]["cdc_checksum"]
