"""A stream's counters after each batch, as its status in the catalog shows them: rows and
batches (going on across runner restarts), the last commit applied, the lag behind it and the
batch's rate."""

from __future__ import annotations

from typing import Any

LAGS_KEPT = 1000
"""Lag samples a runner keeps per stream (the status shows the last `LAGS_SHOWN`)."""
LAGS_SHOWN = 200


def count_batch(stats: dict[str, Any], result: dict[str, Any], now_micros: int
                ) -> dict[str, Any]:
    """Count a batch's `result` (rows, seconds, last_micros) into `stats`; return the status
    fields they give at `now_micros`."""
    stats["rows_processed"] = stats.get("rows_processed", 0) + result["rows"]
    stats["batches"] = stats.get("batches", 0) + 1
    if result["last_micros"] is not None:
        stats["last_applied_commit"] = result["last_micros"]
    last = stats.get("last_applied_commit")
    lag = (now_micros - last) / 1e6 if last is not None else None
    lags = stats.setdefault("lags", [])
    if lag is not None and result["rows"]:
        lags.append(lag)
        del lags[:-LAGS_KEPT]
    return {"rows_processed": stats["rows_processed"], "batches": stats["batches"],
            "lag_seconds": lag, "last_applied_commit": last, "lag_samples": lags[-LAGS_SHOWN:],
            "throughput_rows_per_second": (result["rows"] / result["seconds"]
                                           if result["seconds"] else 0.0)}
