"""The long sysbench proof for the MySQL/MariaDB source (issue 12): `sysbench oltp_read_write
prepare` (4 tables of 100,000 rows), then the stream (backfill plus binlog CDC) starts while
`sysbench oltp_read_write --threads=4 --time=120 run` goes on, and the whole runner is
SIGKILLed at 10 points: during the backfill, at the handoff to CDC and at random while
streaming. At the end the capture has reached the server's binlog position and each sbtest
table equals its CDC table (checksums over rows sorted by key). The baseline is the source
itself: every figure compares the CDC side with MariaDB's own rows, read in the same run.
The tests run a short version (tests/integration/mysql/test_sysbench.py).
Usage: python bench/bench_sysbench_campaign.py [--seconds 120] [--threads 4]
       [--table-size 100000] [--tables 4] [--kills 10] [--rate TPS] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from cdcflow.proof_sysbench import SysbenchCampaign, sysbench_campaign


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=120)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--table-size", type=int, default=100_000)
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--rate", type=int, default=None,
                        help="sysbench --rate in transactions per second (default: unbounded)")
    parser.add_argument("--chunk-rows", type=int, default=5_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        report = sysbench_campaign(SysbenchCampaign(
            Path(folder), tables=args.tables, table_size=args.table_size,
            threads=args.threads, seconds=args.seconds, kills=args.kills, rate=args.rate,
            chunk_rows=args.chunk_rows, seed=args.seed))
    show(args, report)
    ok = all(check["equal"] for check in report["checks"].values())
    raise SystemExit(0 if ok and not report["password_in_files"] else 1)


def show(args: argparse.Namespace, report: dict[str, Any]) -> None:
    bench, binlog = report["sysbench"], report["binlog"]
    print(f"sysbench campaign: {args.tables} tables x {args.table_size:,} rows, oltp_read_write "
          f"--threads={args.threads} --time={args.seconds}"
          f"{f' --rate={args.rate}' if args.rate else ''}, {len(report['kills'])} SIGKILLs "
          f"of the runner, {report['seconds']} s in all")
    print(f"  sysbench: {bench.get('transactions', 0):,.0f} transactions "
          f"({bench.get('tps', 0):.1f}/s), {bench.get('writes', 0):,.0f} writes, "
          f"{bench.get('ignored_errors', 0):,.0f} ignored errors; the stream processed "
          f"{report['status'].get('rows_processed') or 0:,} changed rows")
    points = [k["at"].split()[0] for k in report["kills"]]
    print("  killed at:", {point: points.count(point) for point in dict.fromkeys(points)},
          "| seconds into sysbench:", [k["after_seconds"] for k in report["kills"]])
    print(f"  binlog: {binlog['cdc_transactions']:,} transactions after the snapshot "
          f"({binlog['snapshot'].get('gtid')}); server at {binlog['server']}, capture "
          f"reached {binlog['captured']}")
    for name, check in report["checks"].items():
        print(f"  {name}: {check['rows']:,} rows (CDC {check['cdc_rows']:,}), equal: "
              f"{check['equal']} (md5 {check['checksum'][:12]} vs "
              f"{check['cdc_checksum'][:12]})")
        if not check["equal"]:
            print("    missing:", check["missing"], "extra:", check["extra"],
                  "different:", json.dumps(check["different"], default=str)[:600])
    print("  password found in files:", report["password_in_files"] or "none")
    print("  stream errors:", json.dumps(report["errors"])[:500])
    ok = all(check["equal"] for check in report["checks"].values())
    print("  RESULT:", "nothing lost, nothing doubled" if ok else "MISMATCH")


if __name__ == "__main__":
    main()
