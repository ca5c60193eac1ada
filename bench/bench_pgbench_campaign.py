"""The long pgbench proof (issue 10): `pgbench -i -s 10`, then the stream (backfill plus CDC)
starts while `pgbench -c 4 -T 60` runs, and the whole runner is SIGKILLed at 20 points:
during the backfill, at the handoff to CDC and at random while streaming. At the end each
keyed table equals its CDC table (checksums over sorted rows) and pgbench_history (no key)
has exactly one event per row. The baseline is the source itself: every figure compares the
CDC side with PostgreSQL's own rows, read in the same run. The tests run a short version
(tests/integration/postgres/test_pgbench.py).
Usage: python bench/bench_pgbench_campaign.py [--scale 10] [--seconds 60] [--kills 20]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from cdcflow.proof import Campaign, pgbench_campaign


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        campaign = pgbench_campaign(Campaign(Path(folder), scale=args.scale,
                                             seconds=args.seconds, kills=args.kills,
                                             seed=args.seed))
    report = campaign.report
    checks = report["checks"]
    print(f"pgbench campaign: scale {args.scale}, -c 4 -T {args.seconds}, "
          f"{len(report['kills'])} SIGKILLs of the runner, {report['seconds']} s in all")
    points = [k["at"].split()[0] for k in report["kills"]]
    print("  killed at:", {point: points.count(point) for point in dict.fromkeys(points)},
          "| stream state at each kill:", sorted({k["phase"] for k in report["kills"]}))
    for name, check in checks.items():
        if "equal" in check:
            print(f"  {name}: {check['rows']:,} rows, CDC table equal: {check['equal']} "
                  f"(md5 {check['checksum'][:12]} vs {check['cdc_checksum'][:12]})")
        else:
            print(f"  {name}: {check['rows']:,} rows, {check['events']:,} events, "
                  f"{check['unique_uuids']:,} distinct uuids (ratio "
                  f"{check['events'] / max(check['rows'], 1):.3f})")
    print("  stream errors:", json.dumps(report["errors"])[:500])
    ok = all(c.get("equal", c.get("events") == c.get("rows")) for c in checks.values())
    print("  RESULT:", "nothing lost, nothing doubled" if ok else "MISMATCH")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
