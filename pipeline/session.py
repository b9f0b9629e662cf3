"""Spark sessions that can use the "raftbroker" data source.

Role: the small amount of set-up every job (and the tests) repeat: Python workers on the
driver's interpreter (where the `spark` extra is installed), and the source registered.

Rules:
- `PYSPARK_PYTHON` must name the current interpreter before the JVM starts, or workers run
  another Python that lacks this package (or has another PySpark).
- Registration is per session: call `register(spark)` on any session you build yourself.
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession


def prepare_worker_environment() -> None:
    """Workers start from the JVM's environment, which it takes from ours at launch."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # stay on loopback, not eth0
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def register(spark: SparkSession) -> None:
    from pipeline.source import RaftbrokerDataSource  # noqa: PLC0415  (keeps import light)

    spark.dataSource.register(RaftbrokerDataSource)


def local_session(app_name: str = "raftbroker", master: str = "local[2]") -> SparkSession:
    """A small local session (no UI or progress bars, few shuffle partitions, quiet logs)
    with the source."""
    prepare_worker_environment()
    spark = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        # No "[Stage 3:> (0 + 2) / 2]" bars on stderr: a command's stderr is its one-line
        # errors and summaries.
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
