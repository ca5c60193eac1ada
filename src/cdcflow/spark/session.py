"""A local SparkSession set up for cdcflow: workers use this interpreter, loopback only."""

from __future__ import annotations

import os
import sys
from typing import Any


def session(app_name: str = "cdcflow", master: str = "local[*]", **conf: str) -> Any:
    """Get or create a SparkSession with the "cdcflow" data source registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from cdcflow.spark.source import ChangeStreamSource

    builder = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
    )
    for key, value in conf.items():
        builder = builder.config(key.replace("_", "."), value)
    spark = builder.getOrCreate()
    spark.dataSource.register(ChangeStreamSource)
    return spark
