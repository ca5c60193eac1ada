"""The SPARK_HOME cdcflow gives a pip-installed pyspark: every entry of the package linked but
`python`, so Python workers import pyspark with its compiled files, not from a source zip."""

from __future__ import annotations

import os
from pathlib import Path

import pyspark
import pytest

from cdcflow.spark.session import _spark_home_without_python_zips as spark_home

pytestmark = pytest.mark.unit


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "cdcflow"


def test_the_home_links_everything_but_the_python_zips(cache: Path):
    home = spark_home()
    package = Path(pyspark.__file__).parent
    assert home is not None and Path(home).parent == cache
    linked = {entry.name for entry in Path(home).iterdir()}
    assert linked == {entry.name for entry in package.iterdir()} - {"python"}
    assert (Path(home) / "jars").resolve() == (package / "jars").resolve()
    assert (Path(home) / "bin" / "spark-submit").exists()
    assert spark_home() == home  # made once, reused


def test_a_home_the_user_set_is_kept(monkeypatch: pytest.MonkeyPatch, cache: Path):
    monkeypatch.setenv("SPARK_HOME", "/opt/spark")
    assert spark_home() is None
    assert not cache.exists()


def test_a_home_others_can_write_to_is_not_used(cache: Path):
    home = spark_home()
    assert home is not None
    os.chmod(home, 0o777)
    assert spark_home() is None
