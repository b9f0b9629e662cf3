"""The jobs of pipeline/jobs against a real cluster: the audit finds what it must, and
settlement_totals computes the totals a generated run implies, once each event."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import SparkSession

from cluster.client import Client, Producer, ProducerConfig
from cluster.client.sync import SyncClient
from cluster.local.launcher import LocalCluster
from pipeline.jobs import settlement_totals
from pipeline.jobs.audit import _per_partition, audit
from pipeline.jobs.settlements import expected_totals, generate, settlements
from pipeline.schema import read_schema
from tests.pipeline.conftest import new_topic, produce

pytestmark = pytest.mark.spark
VALUE_KEY = "CAST(value AS STRING)"


async def send_plain(bootstrap: list[str], topic: str, values: list[bytes]) -> None:
    """Through a producer that is not idempotent: a resend is a second copy."""
    cluster = Client(bootstrap)
    try:
        async with Producer(cluster, ProducerConfig(idempotent=False)) as producer:
            await asyncio.gather(*[await producer.send(topic, v, key=v) for v in values])
    finally:
        await cluster.close()


def test_audit_finds_the_duplicates_a_non_idempotent_producer_made(
    spark: SparkSession, client: SyncClient, broker: LocalCluster, bootstrap: str
) -> None:
    topic = new_topic(client, 2, "plain")
    values = [b"order-%04d" % i for i in range(200)]
    resent = values[10:17]  # a client that retried 7 sends whose acks it lost
    asyncio.run(send_plain(broker.bootstrap, topic, values + resent))
    report = audit(spark, bootstrap, topic, business_key=VALUE_KEY)
    assert report.records == 207
    assert sum(p.duplicates_by_business_key for p in report.partitions) == 7
    assert sum(p.non_idempotent_records for p in report.partitions) == 207
    assert sum(p.duplicates_by_producer_sequence for p in report.partitions) == 0
    assert not report.clean


def test_audit_of_an_idempotent_topic_is_clean(
    spark: SparkSession, client: SyncClient, bootstrap: str
) -> None:
    topic = new_topic(client, 3, "idem")
    produce(client, topic, [b"pay-%04d" % i for i in range(300)])
    report = audit(spark, bootstrap, topic, business_key=VALUE_KEY)
    assert report.clean and report.records == 300
    assert all(p.producers == 1 and p.sequence_gaps == 0 for p in report.partitions)
    assert len({p.producer_ids for p in report.partitions}) == 1  # one producer everywhere


def test_audit_counts_repeated_sequences_and_gaps(spark: SparkSession) -> None:
    # What no healthy broker stores, built by hand: (partition, offset, producer, epoch, seq);
    # the last of producer 7 is its next epoch, starting at sequence 0 again: neither.
    rows = [
        (0, 0, 7, 0, 0),
        (0, 1, 7, 0, 1),
        (0, 2, 7, 0, 1),
        (0, 3, 7, 0, 5),
        (0, 4, 7, 1, 0),
        (1, 0, -1, -1, -1),
    ]
    schema = read_schema(include_headers=False)
    full = [(None, b"v", "t", p, o, None, 0, pid, ep, seq) for p, o, pid, ep, seq in rows]
    frame = spark.createDataFrame(full, schema)
    by_partition = {r["partition"]: r for r in _per_partition(frame, keyed=False).collect()}
    p0 = by_partition[0]
    assert (p0["pid_dups"], p0["gaps"], p0["missing"]) == (1, 1, 3)  # 1 repeated; 2..4 lost
    assert by_partition[1]["non_idempotent_records"] == 1


def test_settlement_totals_counts_every_event_once(
    spark: SparkSession, client: SyncClient, broker: LocalCluster, bootstrap: str, tmp_path: Path
) -> None:
    source, totals_topic = new_topic(client, 3, "settle"), new_topic(client, 2, "totals")
    count, merchants, seed = 600, 7, 42

    async def feed() -> None:
        cluster = Client(broker.bootstrap)
        try:
            await generate(cluster, source, count, rate_per_s=0, merchants=merchants, seed=seed)
        finally:
            await cluster.close()

    asyncio.run(feed())
    # An upstream replay: 25 events sent again by a producer that is not idempotent.
    again = [s.encode(1) for s in list(settlements(count, merchants, seed))[:25]]
    asyncio.run(send_plain(broker.bootstrap, source, again))
    job = settlement_totals.TotalsJob(
        bootstrap,
        source,
        totals_topic,
        tmp_path / "totals.parquet",
        tmp_path / "checkpoint",
        max_offsets_per_trigger=250,
        available_now=True,
    )
    settlement_totals.run(spark, job, timeout_s=120)
    expected = expected_totals(count, merchants, seed)

    table = spark.read.parquet(str(job.parquet_dir)).collect()
    assert {r["merchant_id"]: (r["total_cents"], r["events"]) for r in table} == expected
    latest: dict[str, tuple[int, int]] = {}
    topic_rows = (
        spark.read.format("raftbroker")
        .option("raftbroker.bootstrap.servers", bootstrap)
        .option("subscribe", totals_topic)
        .load()
        .orderBy("offset")
        .collect()
    )
    for row in topic_rows:
        total = json.loads(bytes(row["value"]))
        latest[total["merchant_id"]] = (total["total_cents"], total["events"])
    assert latest == expected
