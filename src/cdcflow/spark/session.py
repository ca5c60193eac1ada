"""A local SparkSession set up for cdcflow: workers use this interpreter, loopback only, and
a quiet console (errors only, no progress bars) unless `verbose`."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

_QUIET_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
"""


def _quiet_log_config() -> str:
    """A log4j2 configuration that lets only errors through, written once per user."""
    path = Path(tempfile.gettempdir()) / f"cdcflow-log4j2-quiet-{os.getuid()}.properties"
    if not path.exists() or path.read_text() != _QUIET_LOG4J:
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(_QUIET_LOG4J)
        os.replace(temporary, path)
    return str(path)


def session(app_name: str = "cdcflow", master: str = "local[*]", verbose: bool = False,
            **conf: str) -> Any:
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
    if not verbose:
        builder = (builder.config("spark.ui.showConsoleProgress", "false")
                   .config("spark.driver.extraJavaOptions",
                           f"-Dlog4j2.configurationFile=file:{_quiet_log_config()}"))
    for key, value in conf.items():
        builder = builder.config(key.replace("_", "."), value)
    spark = builder.getOrCreate()
    if not verbose:
        spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(ChangeStreamSource)
    return spark
