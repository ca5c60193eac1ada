"""House rules that code review alone would let slip: the packages' import arrows
(model <- store, capture, table <- spark <- streams <- cli), pyspark only under spark/ and never
at import time of table/ or streams/, and time only through the clock."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
SOURCE = Path(__file__).parents[2] / "src" / "cdcflow"

# What each package may import from cdcflow (besides itself, errors and clock).
ALLOWED = {
    "model": set(),
    "store": {"model"},
    "capture": {"model", "store"},
    "table": {"model"},
    "events": {"model"},
    "spark": {"model", "store", "table", "events"},
    "streams": {"model", "store", "capture", "table", "events", "spark"},
    "cli": {"model", "store", "capture", "table", "events", "spark", "streams", "workload"},
}


def cdcflow_imports(path: Path) -> set[str]:
    """The cdcflow packages a module imports (first component after `cdcflow.`)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "cdcflow" and len(parts) > 1:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_point_one_way(package: str):
    wrong = {}
    for path in sorted((SOURCE / package).rglob("*.py")):
        bad = cdcflow_imports(path) - ALLOWED[package] - {package, "errors", "clock"}
        if bad:
            wrong[str(path.relative_to(SOURCE))] = sorted(bad)
    assert wrong == {}


def test_pyspark_is_imported_only_under_spark():
    offenders = []
    for path in SOURCE.rglob("*.py"):
        if "spark" in path.relative_to(SOURCE).parts[:1]:
            continue
        text = path.read_text()
        if re.search(r"^\s*(import|from) pyspark", text, re.MULTILINE):
            offenders.append(str(path.relative_to(SOURCE)))
    assert offenders == []


def test_table_streams_and_capture_load_no_pyspark():
    """Importing them (the runner included) loads no pyspark: it is imported only by a
    Spark job, inside spark/."""
    code = (
        "import sys\n"
        "import cdcflow.table, cdcflow.table.fold, cdcflow.table.pending\n"
        "import cdcflow.streams.runner, cdcflow.streams.setup, cdcflow.streams.workers\n"
        "import cdcflow.streams.backfill, cdcflow.streams.discovery, cdcflow.capture.embedded\n"
        "import cdcflow.spark.pipeline, cdcflow.spark.queries\n"
        "loaded = sorted(m for m in sys.modules if m == 'pyspark' or m.startswith('pyspark.'))\n"
        "print(loaded)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=120)
    assert result.stdout.strip() == "[]"


def test_time_only_through_the_clock():
    """No wall-clock reads outside clock.py, so tests can drive time."""
    wall = re.compile(r"time\.time\(\)|time\.time_ns\(\)|datetime\.now\(|datetime\.utcnow\(")
    offenders = [f"{path.relative_to(SOURCE)}:{number}"
                 for path in SOURCE.rglob("*.py") if path.name != "clock.py"
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if wall.search(line)]
    assert offenders == []
