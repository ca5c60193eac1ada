"""The PySpark side of cdcflow: the "cdcflow" data source and the session helper.

This is the only package that imports pyspark.
"""

from cdcflow.spark.session import session
from cdcflow.spark.source import ChangeStreamSource

__all__ = ["ChangeStreamSource", "session"]
