"""The fault campaign's figures (`cdcflow.faultkit`): faults by kind, changes committed,
lost and duplicated by `cdcflow verify`'s reports, and recovery times."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cdcflow.faultkit import Campaign


def figures(campaign: Campaign, reports: dict[str, dict[str, Any]], counts_files: list[Path],
            seconds: float) -> dict[str, Any]:
    counts = [json.loads(f.read_text()) for f in counts_files if f.exists()]
    objects = [o for report in reports.values() for o in report["objects"]]
    lost = sum(o[side].get("missing", 0) + o[side].get("differ", 0)
               for o in objects for side in ("cdc_table", "events"))
    duplicated = sum(o[side].get("extra", 0) + o[side].get("duplicated", 0)
                     for o in objects for side in ("cdc_table", "events"))
    every = [r for kind in campaign.recoveries.values() for r in kind]
    return {
        "faults": campaign.injected, "faults_total": sum(campaign.injected.values()),
        "transactions_committed": sum(c.get("transactions", 0) for c in counts),
        "changes_committed": sum(c.get("changes", 0) for c in counts),
        "changes_lost": lost, "changes_duplicated": duplicated,
        "duplicate_event_uuids": sum(o["events"].get("duplicate_uuids", 0) for o in objects),
        "verify_equal": all(report["equal"] for report in reports.values()),
        "verify": reports, "wall_seconds": round(seconds, 1),
        "recovery_p50_seconds": _percentile(every, 0.5),
        "recovery_p99_seconds": _percentile(every, 0.99),
        "recovery_p50_by_kind": {kind: _percentile(found, 0.5)
                                 for kind, found in campaign.recoveries.items()},
    }


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values) or [0.0]
    if fraction == 0.5:
        return round(statistics.median(ordered), 2)
    return round(ordered[int(fraction * (len(ordered) - 1))], 2)
