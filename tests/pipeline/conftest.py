"""Fixtures for the Spark connector tests: one real 3-node cluster and one local[2] Spark
session for the whole run (both are slow to start), stopped afterwards (the nodes by PID).

The session carries Spark's own Kafka connector (resolved from Maven Central when it starts)
for the tests that compare with it (`kafka_connector`). Where it does not resolve the session
starts without it and those tests are skipped with the reason, unless RAFTBROKER_REQUIRE_JAVA=1
(as .ci/run sets), where the session fails instead.

Tests that need them are marked `spark`; the option and offset tests need neither."""

from __future__ import annotations

import asyncio
import gc
import itertools
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import pytest

from cluster.client.sync import SyncClient
from cluster.local import launcher

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

T = TypeVar("T")
QUERY_TIMEOUT_S = 90

READY_TIMEOUT_S = 60.0
# Small segments and a quick retention check, so a test can watch retention delete records.
CLUSTER_TOML = """
[limits]
segment_bytes_max = 65536
[timing]
retention_check_interval_ms = 300
"""
_topic_numbers = itertools.count()


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[launcher.LocalCluster]:
    data_dir: Path = tmp_path_factory.mktemp("pipeline-cluster")
    cluster = launcher.up(data_dir, 3, CLUSTER_TOML)
    try:
        asyncio.run(launcher.wait_ready(cluster, READY_TIMEOUT_S))
        yield cluster
    finally:
        launcher.down(cluster.current())


@pytest.fixture(scope="session")
def bootstrap(broker: launcher.LocalCluster) -> str:
    return ",".join(broker.bootstrap)


@pytest.fixture(scope="session")
def client(broker: launcher.LocalCluster) -> Iterator[SyncClient]:
    with SyncClient(broker.bootstrap) as c:
        yield c


def session_with(packages: list[str]) -> SparkSession | None:
    """The tests' session, with the Maven `packages`; None where they did not resolve (Ivy's
    report is on stderr), unless RAFTBROKER_REQUIRE_JAVA=1: then that failure."""
    from pyspark.errors import PySparkRuntimeError  # noqa: PLC0415  (needs the spark extra)

    from pipeline.session import local_session  # noqa: PLC0415

    failure: PySparkRuntimeError | None = None
    try:
        return local_session("raftbroker-tests", packages=packages)
    except PySparkRuntimeError as exc:  # JAVA_GATEWAY_EXITED
        if os.environ.get("RAFTBROKER_REQUIRE_JAVA") == "1":
            raise
        failure = exc
    # PySpark leaves its pipe to the failed JVM's stdin open: a ResourceWarning when collected.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        del failure
        gc.collect()
    return None


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    pytest.importorskip("pyspark")
    from pipeline.session import (  # noqa: PLC0415  (needs the spark extra)
        kafka_connector_package,
        local_session,
    )

    # Without the connector where it did not resolve: `kafka_connector` skips its tests.
    session = session_with([kafka_connector_package()]) or local_session("raftbroker-tests")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def kafka_connector(spark: SparkSession) -> str:
    """Spark's Kafka connector (format "kafka"), on the session's classpath: its package."""
    from pipeline.session import kafka_connector_package  # noqa: PLC0415

    connector = kafka_connector_package()
    if connector not in spark.sparkContext.getConf().get("spark.jars.packages", ""):
        pytest.skip(
            f"Spark's Kafka connector {connector} did not resolve from Maven Central "
            "(pytest -s shows Ivy's report)"
        )
    return connector


def new_topic(client: SyncClient, partitions: int, prefix: str = "t") -> str:
    """A fresh topic (names are never reused within a run), replicated 3 times."""
    name = f"{prefix}{next(_topic_numbers)}"
    client.create_topic(name, partitions=partitions, replication_factor=3)
    return name


def produce(
    client: SyncClient,
    topic: str,
    values: list[bytes],
    *,
    partition: int | None = None,
    headers: tuple[tuple[str, bytes], ...] = (),
) -> list[int]:
    """Send through one idempotent producer; the offsets, once all are acknowledged."""
    with client.producer() as producer:
        futures = [
            producer.send(topic, v, key=v, partition=partition, headers=headers) for v in values
        ]
        producer.flush()
        return [f.result(30).offset for f in futures]


def finished(query: StreamingQuery) -> StreamingQuery:
    """`query` (an availableNow one) once it has ended, without an exception."""
    assert query.awaitTermination(QUERY_TIMEOUT_S), "the availableNow query did not finish"
    assert query.exception() is None
    return query


def available_now_batches(
    stream: DataFrame, checkpoint: Path, each: Callable[[DataFrame], T]
) -> list[T]:
    """Run a streaming read until it has read what was there when it started (availableNow,
    from `checkpoint`); `each` of every micro-batch, on the driver, in order."""
    batches: list[T] = []

    def collect(df: DataFrame, _batch_id: int) -> None:
        batches.append(each(df))

    query = (
        stream.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    finished(query)
    return batches
