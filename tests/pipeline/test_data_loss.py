"""failOnDataLoss against a real cluster: retention deleted the start of the requested range."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import SparkSession

from cluster.client import Consumer
from cluster.client.sync import SyncClient
from tests.pipeline.conftest import produce
from tests.polling import poll_until

pytestmark = pytest.mark.spark
DEADLINE_S = 30
EARLIEST = Consumer.EARLIEST


def read_from_zero(spark: SparkSession, bootstrap: str, topic: str, fail: str) -> list[int]:
    df = (
        spark.read.format("raftbroker")
        .option("raftbroker.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", f'{{"{topic}": {{"0": 0}}}}')
        .option("endingOffsets", "latest")
        .option("failOnDataLoss", fail)
        .load()
    )
    return sorted(r["offset"] for r in df.select("offset").collect())


def test_a_range_retention_deleted_fails_or_is_skipped_as_asked(
    spark: SparkSession, client: SyncClient, bootstrap: str
) -> None:
    topic = "retained"
    client.create_topic(topic, partitions=1, replication_factor=3, retention_bytes=100_000)
    produce(client, topic, [b"%05d" % i + b"x" * 1_000 for i in range(400)])  # ~6 segments
    start = poll_until(
        lambda: client.call(client.admin.list_offsets(topic, 0, EARLIEST)),
        DEADLINE_S,
        "retention to move the log start",
    )
    with pytest.raises(Exception, match="failOnDataLoss"):
        read_from_zero(spark, bootstrap, topic, "true")
    offsets = read_from_zero(spark, bootstrap, topic, "false")
    assert offsets[0] >= start and offsets[-1] == 399
    assert offsets == list(range(offsets[0], 400))
