"""Spark's own Kafka connector (`spark-sql-kafka-0-10`, format "kafka") against the cluster's
Kafka listener: batch reads (`subscribe`, `assign`, per-partition offsets), a streaming read
that resumes from its checkpoint, and its sink (batch and streaming), each checked record by
record against what our native client produced or reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from kafka.partitioner.default import murmur2
from pyspark.sql import DataFrame, SparkSession

from cluster.client.consumer import ConsumedRecord
from cluster.client.sync import SyncClient
from cluster.clock import wall_ms
from cluster.local.launcher import LocalCluster
from tests.pipeline.conftest import available_now_batches, finished, new_topic, produce

pytestmark = pytest.mark.spark
READ_BACK_IDLE_S = 0.5  # every write below is acknowledged (acks=all) before it is read back

Record = tuple[int, int, bytes, bytes]  # (partition, offset, key, value)
# A row for the sink: topic, key, value, partition, headers
SinkRow = tuple[str, str | None, bytes, int | None, list[tuple[str, bytes]]]


@pytest.fixture(scope="module")
def servers(broker: LocalCluster, kafka_connector: str) -> str:
    """`kafka.bootstrap.servers`: the Kafka listeners (not the native ports)."""
    return ",".join(broker.kafka_bootstrap)


def kafka_read(spark: SparkSession, servers: str, **options: str) -> DataFrame:
    return (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", servers)
        .options(**options)
        .load()
    )


def records_of(df: DataFrame) -> list[Record]:
    rows = df.select("partition", "offset", "key", "value").collect()
    return sorted((r[0], r[1], bytes(r[2]), bytes(r[3])) for r in rows)


def produced(client: SyncClient, topic: str, counts: dict[int, int], tag: str = "") -> list[Record]:
    """`counts[p]` records on partition p (key = value = "p<p>-<n><tag>"); what they are."""
    records = []
    for partition, count in counts.items():
        values = [f"p{partition}-{n}{tag}".encode() for n in range(count)]
        offsets = produce(client, topic, values, partition=partition)
        records += [(partition, o, v, v) for o, v in zip(offsets, values, strict=True)]
    return sorted(records)


def test_batch_subscribe_reads_every_record_once_with_its_columns(
    spark: SparkSession, client: SyncClient, servers: str
) -> None:
    topic = new_topic(client, 3)
    before_ms = wall_ms()  # the producer's clock (CreateTime)
    expected = produced(client, topic, {0: 12, 1: 7, 2: 9})
    after_ms = wall_ms()
    df = kafka_read(
        spark, servers, subscribe=topic, startingOffsets="earliest", endingOffsets="latest"
    )
    assert df.columns == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType",
    ]  # fmt: skip
    rows = df.selectExpr("*", "unix_millis(timestamp) AS ms").collect()
    # Offsets 0..n-1 of each partition, each record once, with its key and value.
    assert sorted((r.partition, r.offset, bytes(r.key), bytes(r.value)) for r in rows) == expected
    assert {(r.topic, r.timestampType) for r in rows} == {(topic, 0)}  # CreateTime
    assert all(before_ms <= r.ms <= after_ms for r in rows)


def test_batch_assign_reads_exactly_the_offset_slice(
    spark: SparkSession, client: SyncClient, servers: str
) -> None:
    topic = new_topic(client, 3)
    everything = produced(client, topic, {0: 8, 1: 4, 2: 5})
    df = kafka_read(
        spark,
        servers,
        assign=json.dumps({topic: [0, 2]}),  # partition 1 is not read
        startingOffsets=json.dumps({topic: {"0": 3, "2": -2}}),  # -2: earliest
        endingOffsets=json.dumps({topic: {"0": 6, "2": -1}}),  # -1: latest (exclusive ends)
    )
    assert records_of(df) == [r for r in everything if r[0] == 0 and 3 <= r[1] < 6] + [
        r for r in everything if r[0] == 2
    ]


def run_available_now(
    spark: SparkSession, servers: str, topic: str, checkpoint: Path
) -> list[list[Record]]:
    """A streaming read of what the topic has when it starts, from the checkpoint (or from
    earliest, the first time); the records of each micro-batch."""
    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    return available_now_batches(stream, checkpoint, records_of)


def test_streaming_read_resumes_from_its_checkpoint(
    spark: SparkSession, client: SyncClient, servers: str, tmp_path: Path
) -> None:
    topic = new_topic(client, 2)
    checkpoint = tmp_path / "checkpoint"
    first = produced(client, topic, {0: 6, 1: 4})
    first_run = run_available_now(spark, servers, topic, checkpoint)
    assert sorted(r for b in first_run for r in b) == first

    # Written after the first run: the second starts where the checkpoint says the first ended
    # (startingOffsets applies to a new query only) and reads these, and nothing else.
    second = produced(client, topic, {0: 3, 1: 2}, tag="-new")
    assert [r[1] for r in second] == [6, 7, 8, 4, 5]
    second_run = run_available_now(spark, servers, topic, checkpoint)
    assert sorted(r for b in second_run for r in b) == second


def read_back(client: SyncClient, topic: str) -> list[ConsumedRecord]:
    return client.consume(topic, idle_timeout_s=READ_BACK_IDLE_S)


def test_batch_write_appends_every_row_where_the_kafka_partitioner_puts_it(
    spark: SparkSession, client: SyncClient, servers: str
) -> None:
    topic = new_topic(client, 3)
    keyed: list[SinkRow] = [
        (topic, f"k{i}", f"keyed-{i}".encode(), None, [("h", b"%d" % i)]) for i in range(40)
    ]
    pinned: list[SinkRow] = [(topic, None, f"pinned-{i}".encode(), 1, []) for i in range(10)]
    df = spark.createDataFrame(
        keyed + pinned,
        "topic string, key string, value binary, partition int, "
        "headers array<struct<key: string, value: binary>>",
    ).repartition(2)
    df.write.format("kafka").option("kafka.bootstrap.servers", servers).save()  # topic column

    records = read_back(client, topic)
    # Spark's sink is at-least-once: a retried task or a rerun job sends its rows again. Here no
    # task fails, and its producer is idempotent (kafka-clients' default: every record carries
    # a producer id), so the broker drops the producer's own resends: each row is in the topic
    # exactly once.
    assert sorted(r.value or b"" for r in records) == sorted(row[2] for row in keyed + pinned)
    assert all(r.producer_id >= 0 for r in records)
    for r in records:
        assert r.value is not None
        if r.value.startswith(b"keyed"):
            # Kafka's partitioner (murmur2 of the key) over the 3 partitions Metadata gave.
            assert r.partition == (murmur2(r.key) & 0x7FFFFFFF) % 3
            assert r.headers == (("h", r.value.split(b"-")[1]),)
        else:
            assert (r.partition, r.key, r.headers) == (1, None, ())


def test_streaming_write_copies_a_topic(
    spark: SparkSession, client: SyncClient, servers: str, tmp_path: Path
) -> None:
    source, target = new_topic(client, 2), new_topic(client, 2)
    expected = produced(client, source, {0: 5, 1: 5})
    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .load()
        .select("key", "value", "partition")  # each record to the same partition of the copy
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("topic", target)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    finished(query)
    # Per partition in the source's order (one task a partition, one producer): offsets too.
    assert sorted((r.partition, r.offset, r.key, r.value) for r in read_back(client, target)) == (
        expected
    )
