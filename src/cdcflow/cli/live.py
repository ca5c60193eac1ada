"""The live view of streams: a `rich` table on a terminal, plain log lines otherwise."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from rich.table import Table

from cdcflow.streams.catalog import Catalog


def snapshot(catalog: Catalog) -> list[dict[str, Any]]:
    return [catalog.status(r.name) for r in catalog.records()]


def render(rows: list[dict[str, Any]]) -> Table:
    table = Table("stream", "state", "backfill", "rows", "rows/s", "lag s", "batches",
                  "partitions", title="cdcflow streams")
    for row in rows:
        backfill = row.get("backfill") or {}
        done = sum(1 for b in backfill.values() if b.get("state") == "COMPLETED")
        lag = row.get("lag_seconds")
        table.add_row(row["name"], row["state"], f"{done}/{len(backfill)}",
                      str(row.get("rows_processed", 0)),
                      f"{row.get('throughput_rows_per_second', 0.0):.0f}",
                      "-" if lag is None else f"{lag:.2f}", str(row.get("batches", 0)),
                      str(row.get("partitions", "-")))
    return table


def log_line(rows: list[dict[str, Any]]) -> str:
    keys = ("name", "state", "rows_processed", "batches", "lag_seconds", "partitions")
    return time.strftime("%H:%M:%S ") + json.dumps([{k: r.get(k) for k in keys} for r in rows])


def is_terminal() -> bool:
    return sys.stdout.isatty()
