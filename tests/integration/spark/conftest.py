from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One SparkSession for the whole test process (a session costs ~5 s to start)."""
    from cdcflow.spark import session

    spark = session("cdcflow-tests", master="local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    yield spark
    spark.stop()
