"""`cdcflow verify --catalog C STREAM [--object O] [--json]`: does every destination of a
stream hold what its source holds? Exit status 0 when all is equal, 1 on any difference."""

from __future__ import annotations

import os

import click

from cdcflow.cli.streams import DEFAULT_CATALOG, _emit, _errors, json_option
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.verify import verify as run_verify


@click.command()
@click.option("--catalog", default=lambda: os.environ.get("CDCFLOW_CATALOG", DEFAULT_CATALOG),
              show_default=DEFAULT_CATALOG, help="The catalog file.")
@click.argument("name")
@click.option("--object", "object_name", default=None, help="Only this object.")
@click.option("--wait-seconds", default=600.0, show_default=True,
              help="How long to wait for the runner to drain the stream.")
@json_option
@_errors
def verify(catalog: str, name: str, object_name: str | None, wait_seconds: float,
           as_json: bool) -> None:
    """Compare every object of stream NAME with its CDC table and its event files: row
    counts, missing, extra and differing rows with sample keys, and whether the events,
    deduplicated by uuid and replayed in sort_keys order, rebuild the source."""
    report = run_verify(Catalog(catalog), name, object_name, wait_seconds)
    _emit(as_json, report, "\n".join(_lines(report)))
    if not report["equal"]:
        raise SystemExit(1)


def _lines(report: dict[str, object]) -> list[str]:
    lines = [f"stream {report['stream']}: {report['how']}; compared at "
             f"{report['compared_at']}"]
    for item in report["objects"]:  # type: ignore[attr-defined]
        verdict = "equal" if item["equal"] else "DIFFERS"
        counts = ", ".join(f"{k} {v:,}" for k, v in item["rows"].items())
        lines.append(f"  {item['object']}: {verdict} ({counts}; {item['seconds']} s)")
        for side in ("cdc_table", "events"):
            found = item.get(side)
            if found and "error" in found:
                lines.append(f"    {side}: cannot be read: {found['error']}")
            elif found and not found["equal"]:
                lines.append(f"    {side}: missing {found['missing']}, extra {found['extra']}, "
                             f"differ {found['differ']}, duplicated {found['duplicated']}; "
                             f"sample keys {found['sample_keys']}")
    lines.append("all equal" if report["equal"] else "differences found")
    return lines
