"""cdcflow's own code for the executors of a cluster (issue 15).

Executors on other machines do not see the driver's Python path. A session on a standalone
master ships this very cdcflow package as a zip through `spark.submit.pyFiles`: executors
import the driver's version, so the two can't differ. Its dependencies (pyarrow, orjson,
fastavro, deltalake) must be installed where the executors run; README "Running on a
cluster". The zip is named by a hash of the package's files and built once per version.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from pathlib import Path

import cdcflow
from cdcflow.spark.class_archive import cache_folder


def _package_files() -> list[tuple[Path, str]]:
    """Each source file of the package and its name inside the zip, sorted."""
    base = Path(cdcflow.__file__).parent
    return sorted((path, f"cdcflow/{path.relative_to(base).as_posix()}")
                  for path in base.rglob("*.py") if "__pycache__" not in path.parts)


def package_zip(cache: Path | None = None) -> Path:
    """The zip of the installed cdcflow package, made atomically in `cache` (the user's
    cache by default) and reused while the package's files are unchanged."""
    files = _package_files()
    digest = hashlib.sha256()
    for path, name in files:
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    folder = cache or cache_folder()
    target = folder / f"cdcflow-{cdcflow.__version__}-{digest.hexdigest()[:16]}.zip"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    handle, building = tempfile.mkstemp(prefix=".cdcflow-", suffix=".zip", dir=folder)
    os.close(handle)
    with zipfile.ZipFile(building, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, name in files:
            archive.write(path, name)
    os.replace(building, target)
    return target
