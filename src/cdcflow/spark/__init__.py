"""The PySpark side of cdcflow: the "cdcflow" data source and the session helper.

This is the only package that imports pyspark.
"""

from cdcflow.spark.pipeline import apply_change_stream
from cdcflow.spark.session import session
from cdcflow.spark.sink import cdc_table_sink
from cdcflow.spark.source import ChangeStreamSource

__all__ = ["ChangeStreamSource", "apply_change_stream", "cdc_table_sink", "session"]
