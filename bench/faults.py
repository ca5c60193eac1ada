"""The fault campaign (issue 14): a mixed workload (inserts, updates, deletes, multi-row
transactions, primary-key updates, partition churn) into the embedded database, streamed by
`cdcflow run` into a CDC table and event files on a 512 MB tmpfs, with --faults faults
injected in turn: SIGKILL of the runner with its JVM at a random moment, mid-apply and
mid-event-write; the destination's disk filled; the destination remounted read-only. With
--postgres a second stream, from a throwaway PostgreSQL with its own writer, runs beside it
under the same runner, and each of those faults has a PostgreSQL fault for company, at a
random moment while it is under way: SIGKILL of the capture worker, or a restart of the
server (a crash and a fast shutdown in turn); so --faults 100 --postgres injects 200. Each
fault is mended as a user would; at the end every stream is drained and `cdcflow verify`
compares. With --standbys N, N more `cdcflow run`s stand by on the catalog: one of them
takes a killed runner's streams over, and the runner started again stands by in its turn.

Prints: faults by kind, changes committed, changes lost and duplicated (both must be 0),
event uuids seen twice, wall time, and recovery time p50/p99 (from the fault to the next
finished batch). The baseline is the exactly-once claim itself: 0 lost, 0 duplicated.
Needs root (tmpfs mounts).
Usage: python bench/faults.py [--faults 100] [--postgres] [--standbys 2] [--seed 1]
       [--kinds kill-runner,...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from cdcflow.faultkit import ALL_KINDS, KINDS, NAME, Campaign, run_campaign
from cdcflow.faultkit_pg import PG_NAME
from cdcflow.streams.catalog import Catalog


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--faults", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--postgres", action="store_true", help="a PostgreSQL stream too")
    parser.add_argument("--kinds", help=f"in turn; default {','.join(KINDS)}; any of "
                        f"{','.join(ALL_KINDS)}")
    parser.add_argument("--rate", type=float, default=40.0, help="writer transactions/s")
    parser.add_argument("--standbys", type=int, default=0,
                        help="runners in standby: one takes a killed runner's streams over; "
                        "without, the runner started again does")
    args = parser.parse_args()
    if args.standbys < 0:
        parser.error(f"--standbys {args.standbys}: the runners in standby are 0 or more")
    folder = Path(tempfile.mkdtemp(prefix="cdcflow-faults-"))
    try:
        kinds = args.kinds.split(",") if args.kinds else KINDS
        result = run_campaign(Campaign(folder, faults=args.faults, kinds=tuple(kinds),
                                       seed=args.seed, writer_rate=args.rate,
                                       postgres=args.postgres, standbys=args.standbys))
    except Exception:
        catalog = Catalog(folder / "catalog.db")
        errors = {name: catalog.errors(name, limit=10) for name in (NAME, PG_NAME)
                  if name in {r.definition.name for r in catalog.streams()}}
        print(f"the campaign failed; its folder is kept: {folder}\nlast errors: "
              f"{json.dumps(errors, indent=1)}")
        raise
    shutil.rmtree(folder, ignore_errors=True)
    verify_report = result.pop("verify")
    print(json.dumps(result, indent=2))
    print(f"faults {result['faults_total']} ({result['faults']}); changes committed "
          f"{result['changes_committed']:,}; lost {result['changes_lost']} (baseline 0); "
          f"duplicated {result['changes_duplicated']} (baseline 0); wall "
          f"{result['wall_seconds']:.0f} s; recovery p50 {result['recovery_p50_seconds']} s "
          f"p99 {result['recovery_p99_seconds']} s; p50 by kind "
          f"{result['recovery_p50_by_kind']}")
    if not all(report["equal"] for report in verify_report.values()):
        print(json.dumps(verify_report, indent=1))
        raise SystemExit(1)


if __name__ == "__main__":
    main()
