"""Helpers shared by the source integration tests (PostgreSQL, MySQL): drain a prepared
stream's change log through the Spark pipeline once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cdcflow.model.timestamps import format_rfc3339, from_micros
from cdcflow.spark.pipeline import start_query
from cdcflow.streams.catalog import Catalog


def drain(spark: Any, setup: Any, tmp_path: Path) -> None:
    """Run the stream's query with availableNow from its cdc_start; fail on its error."""
    status = Catalog(tmp_path / "catalog.db").status(setup.definition.name)
    query = start_query(spark, setup.plan, setup.source.log_location()[0], "changes",
                        format_rfc3339(from_micros(int(status["cdc_start"]))),
                        tmp_path / "ckpt", {"availableNow": True})
    query.awaitTermination()
    assert query.exception() is None
