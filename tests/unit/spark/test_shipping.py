"""cdcflow ships itself to a cluster's executors (issue 15): a zip of the installed package,
named by a hash of its files, importable on its own; and the source's segmentRoot option is
checked like the others."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import cdcflow
from cdcflow.errors import InvalidArgument
from cdcflow.spark.options import parse_options
from cdcflow.spark.shipping import package_zip

pytestmark = pytest.mark.unit


def test_the_package_zip_holds_every_module_and_imports_alone(tmp_path: Path):
    shipped = package_zip(tmp_path)
    base = Path(cdcflow.__file__).parent
    expected = {f"cdcflow/{p.relative_to(base).as_posix()}" for p in base.rglob("*.py")
                if "__pycache__" not in p.parts}
    assert set(zipfile.ZipFile(shipped).namelist()) == expected
    assert shipped.name.startswith(f"cdcflow-{cdcflow.__version__}-")
    assert package_zip(tmp_path) == shipped and len(list(tmp_path.iterdir())) == 1
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import cdcflow.store.segments, "
            "cdcflow.spark.reading; print(cdcflow.__file__)")
    done = subprocess.run([sys.executable, "-I", "-c", code, str(shipped)],
                          capture_output=True, text=True, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{shipped}/cdcflow/__init__.py"


def test_the_segment_root_option(tmp_path: Path):
    options = parse_options({"database": "x.db", "stream": "S", "segmentRoot": str(tmp_path)})
    assert options.segment_root == str(tmp_path)
    with pytest.raises(InvalidArgument, match="storage root 'segs' must be an absolute path"):
        parse_options({"database": "x.db", "stream": "S", "segmentRoot": "segs"})
    table = parse_options({"database": "x.db", "table": "T", "segmentRoot": str(tmp_path)})
    assert table.segment_root == str(tmp_path)
