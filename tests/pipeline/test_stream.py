"""Streaming reads: fixed micro-batches under Trigger.AvailableNow + maxOffsetsPerTrigger, the
replay of an uncommitted batch, a restart from the checkpoint that processes only what is new,
and the admission control rules."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from cluster.client.sync import SyncClient
from pipeline.options import parse_read_options
from pipeline.schema import read_schema
from pipeline.source import StreamReader
from tests.pipeline.conftest import available_now_batches, new_topic, produce

pytestmark = pytest.mark.spark

Batch = list[tuple[int, int, bytes]]  # (partition, offset, value) of each record


def run_available_now(
    spark: SparkSession, bootstrap: str, topic: str, checkpoint: Path, **options: str
) -> list[Batch]:
    """Run the query until it has read what was committed when it started; its batches."""

    def rows_of(df: DataFrame) -> Batch:
        rows = df.select("partition", "offset", "value").collect()
        return sorted((r["partition"], r["offset"], bytes(r["value"])) for r in rows)

    stream = (
        spark.readStream.format("raftbroker")
        .option("raftbroker.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .options(**options)
        .load()
    )
    return available_now_batches(stream, checkpoint, rows_of)


def test_available_now_reads_fixed_batches_and_resumes_from_the_checkpoint(
    spark: SparkSession, client: SyncClient, bootstrap: str, tmp_path: Path
) -> None:
    topic = new_topic(client, 2)
    produce(client, topic, [b"a%d" % i for i in range(5)], partition=0)
    produce(client, topic, [b"b%d" % i for i in range(5)], partition=1)
    checkpoint = tmp_path / "checkpoint"
    options = {"startingOffsets": "earliest", "maxOffsetsPerTrigger": "4"}

    first = run_available_now(spark, bootstrap, topic, checkpoint, **options)
    # 10 records, at most 4 a batch, shared in proportion to each partition's backlog.
    assert [len(b) for b in first] == [4, 4, 2]
    assert first[0] == [(0, 0, b"a0"), (0, 1, b"a1"), (1, 0, b"b0"), (1, 1, b"b1")]
    everything = [r for b in first for r in b]
    assert sorted(everything) == [(0, n, b"a%d" % n) for n in range(5)] + [
        (1, n, b"b%d" % n) for n in range(5)
    ]

    # A crash after the last batch ran but before Spark committed it: Spark replays that batch
    # from its offset log, and the replay reads exactly the same records.
    for name in ("2", ".2.crc"):  # the commit record and its Hadoop checksum
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    replay = run_available_now(spark, bootstrap, topic, checkpoint, **options)
    assert replay == [first[2]]

    produce(client, topic, [b"a%d" % i for i in range(5, 11)], partition=0)
    second = run_available_now(spark, bootstrap, topic, checkpoint, **options)
    assert [len(b) for b in second] == [4, 2]
    assert sorted(r for b in second for r in b) == [(0, n, b"a%d" % n) for n in range(5, 11)]

    third = run_available_now(spark, bootstrap, topic, checkpoint, **options)
    assert [b for b in third if b] == []  # nothing new: nothing processed again


def reader_with(**options: str) -> StreamReader:
    parsed = parse_read_options(
        {"raftbroker.bootstrap.servers": "127.0.0.2:1", "subscribe": "a", **options},
        streaming=True,
    )
    return StreamReader(parsed, read_schema(include_headers=False))


def test_admission_control_without_a_cluster() -> None:
    base = {("a", 0): 10, ("a", 1): 0}
    latest = {("a", 0): 13, ("a", 1): 1}  # a backlog of 4
    held = reader_with(minOffsetsPerTrigger="5", maxTriggerDelay="1h")
    assert held.getDefaultReadLimit() == ReadMinRows(5)
    assert held._admit(base, latest, ReadMinRows(5)) is None  # wait for more records
    assert held._admit(base, latest, ReadAllAvailable()) == latest  # the engine's limit wins
    held._target = latest  # Trigger.AvailableNow never waits for minOffsetsPerTrigger
    assert held._admit(base, latest, ReadMinRows(5)) == latest
    overdue = reader_with(minOffsetsPerTrigger="5", maxTriggerDelay="0ms")
    assert overdue._admit(base, latest, ReadMinRows(5)) == latest
    capped = reader_with(maxOffsetsPerTrigger="2", minOffsetsPerTrigger="1")
    assert capped.getDefaultReadLimit() == ReadMaxRows(2)
    end = capped._admit(base, latest, ReadMaxRows(2))
    assert end is not None and sum(end[tp] - base[tp] for tp in base) == 2
    assert reader_with().getDefaultReadLimit() == ReadAllAvailable()
