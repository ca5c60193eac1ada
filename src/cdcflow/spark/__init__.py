"""The PySpark side of cdcflow: the "cdcflow" data source, sinks and the batch pipeline.

This is the only package that imports pyspark, and it does so lazily: importing
`cdcflow.spark.pipeline` (as the runner does) loads no pyspark until a Spark job runs.
"""

from __future__ import annotations

from typing import Any

from cdcflow.spark.session import session as session  # imports pyspark when called

_EXPORTS = {
    "ChangeStreamSource": "cdcflow.spark.source",
    "append_frame": "cdcflow.spark.sink",
    "apply_change_stream": "cdcflow.spark.pipeline",
    "cdc_table_sink": "cdcflow.spark.sink",
}
__all__ = sorted([*_EXPORTS, "session"])


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'cdcflow.spark' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
