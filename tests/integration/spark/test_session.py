"""The session cdcflow starts: its Python workers import pyspark with compiled files."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def _worker_pyspark(_: object) -> str:
    import pyspark

    return str(pyspark.__file__)


def test_python_workers_import_pyspark_from_site_packages_not_the_source_zip(spark):
    [found] = spark.sparkContext.parallelize([0], 1).map(_worker_pyspark).collect()
    assert ".zip" not in found and found.endswith("pyspark/__init__.py")
