"""Spark sessions that can use the "raftbroker" data source (and, on request, Spark's own
Kafka connector).

Role: the small amount of set-up every job (and the tests) repeat: Python workers on the
driver's interpreter (where the `spark` extra is installed), and the source registered.
`kafka_connector_package()` names the Maven package of Spark's Kafka connector
(`spark-sql-kafka-0-10`, format "kafka") for the installed PySpark, for `local_session`'s
`packages` (Spark resolves it from Maven Central with Ivy when the session starts).

Rules:
- `PYSPARK_PYTHON` must name the current interpreter before the JVM starts, or workers run
  another Python that lacks this package (or has another PySpark).
- Registration is per session: call `register(spark)` on any session you build yourself.
- Packages are fixed when the JVM starts: the first session of a process decides them (one
  SparkContext a process; a later `local_session` returns that one, whatever it asks for).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import pyspark
from pyspark.sql import SparkSession

KAFKA_CONNECTOR = "org.apache.spark:spark-sql-kafka-0-10_2.13"  # PySpark 4 is Scala 2.13
# PySpark releases on PyPI whose connector Maven Central lacks (their POMs answered 404 in
# November 2026; its newest was 4.2.0), and the one used instead: 4.2.0's connector passes
# tests/pipeline/test_kafka_connector.py (batch and streaming reads and writes) on PySpark 4.3.0.
CONNECTOR_STAND_INS = {"4.3.0": "4.2.0", "4.2.1": "4.2.0"}


def prepare_worker_environment() -> None:
    """Workers start from the JVM's environment, which it takes from ours at launch."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # stay on loopback, not eth0
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def register(spark: SparkSession) -> None:
    from pipeline.source import RaftbrokerDataSource  # noqa: PLC0415  (keeps import light)

    spark.dataSource.register(RaftbrokerDataSource)


def kafka_connector_package(spark_version: str = pyspark.__version__) -> str:
    """Spark's Kafka connector for `spark_version` (the installed PySpark's by default), as
    `spark.jars.packages` takes it: the same release, or its stand-in where Maven Central has
    none."""
    return f"{KAFKA_CONNECTOR}:{CONNECTOR_STAND_INS.get(spark_version, spark_version)}"


def local_session(
    app_name: str = "raftbroker", master: str = "local[2]", packages: Sequence[str] = ()
) -> SparkSession:
    """A small local session (no UI or progress bars, few shuffle partitions, quiet logs)
    with the source, and the Maven `packages` ("group:artifact:version") on its classpath.
    A missing package fails the JVM's launch (PySparkRuntimeError JAVA_GATEWAY_EXITED; Ivy's
    report is on stderr)."""
    prepare_worker_environment()
    builder = SparkSession.builder
    if packages:
        builder = builder.config("spark.jars.packages", ",".join(packages))
    spark = (
        builder.master(master)
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
