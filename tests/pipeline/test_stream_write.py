"""Streaming writes: a micro-batch that Spark runs again after a crash adds no record twice.

The query reads topic IN (this connector's replayable source) and writes every record to topic
OUT with `writeStream.format("raftbroker")` (fenced writes, or with
`raftbroker.transactional.id.prefix` transactions that carry the micro-batch's id). Deleting
the last commit file of the checkpoint makes Spark run that micro-batch again, as after a crash
between writing and committing. The negative control writes the same stream with
`foreachBatch` and a plain batch write (the idempotent producer alone): there the replay
duplicates the batch.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from cluster.client.sync import SyncClient
from tests.pipeline.conftest import finished, new_topic, produce

pytestmark = pytest.mark.spark
RECORDS = 30
PER_TRIGGER = 12  # batches of 12, 12 and 6


def source(spark: SparkSession, bootstrap: str, topic: str) -> DataFrame:
    return (
        spark.readStream.format("raftbroker")
        .option("raftbroker.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(PER_TRIGGER))
        .load()
        .selectExpr("key", "value")
    )


def finish(query: StreamingQuery) -> list[tuple[int, int]]:
    """Wait for an availableNow query; (batch id, input rows) of each batch it ran."""
    return [(p["batchId"], p["numInputRows"]) for p in finished(query).recentProgress]


def fenced_run(
    spark: SparkSession, bootstrap: str, src: str, out: str, ckpt: Path
) -> list[tuple[int, int]]:
    query = (
        source(spark, bootstrap, src)
        .writeStream.format("raftbroker")
        .option("raftbroker.bootstrap.servers", bootstrap)
        .option("topic", out)
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    return finish(query)


def transactional_run(
    spark: SparkSession, bootstrap: str, src: str, out: str, ckpt: Path
) -> list[tuple[int, int]]:
    query = (
        source(spark, bootstrap, src)
        .writeStream.format("raftbroker")
        .option("raftbroker.bootstrap.servers", bootstrap)
        .option("raftbroker.transactional.id.prefix", f"sink-{out}")
        .option("topic", out)
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    return finish(query)


def unfenced_run(
    spark: SparkSession, bootstrap: str, src: str, out: str, ckpt: Path
) -> list[tuple[int, int]]:
    def write(df: DataFrame, _batch_id: int) -> None:
        (
            df.write.format("raftbroker")
            .option("raftbroker.bootstrap.servers", bootstrap)
            .option("topic", out)
            .mode("append")
            .save()
        )

    query = (
        source(spark, bootstrap, src)
        .writeStream.foreachBatch(write)
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    return finish(query)


def values(
    spark: SparkSession, bootstrap: str, topic: str, isolation: str = "read_committed"
) -> Counter[bytes]:
    df = (
        spark.read.format("raftbroker")
        .option("raftbroker.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("raftbroker.isolation.level", isolation)
        .load()
    )
    return Counter(bytes(r["value"]) for r in df.select("value").collect())


def forget_last_commit(checkpoint: Path) -> None:
    """A crash after the last batch wrote its output but before Spark recorded it as done."""
    for name in ("2", ".2.crc"):  # the commit record and its Hadoop checksum
        (checkpoint / "commits" / name).unlink(missing_ok=True)


RUNS = {"fenced": fenced_run, "transactional": transactional_run, "negative-control": unfenced_run}


@pytest.mark.parametrize("mode", list(RUNS))
def test_a_replayed_micro_batch_writes_nothing_twice(
    spark: SparkSession, client: SyncClient, bootstrap: str, tmp_path: Path, mode: str
) -> None:
    src, out = new_topic(client, 2, "in"), new_topic(client, 3, "out")
    sent = [b"evt-%03d" % i for i in range(RECORDS)]
    produce(client, src, sent)
    run, fenced = RUNS[mode], mode != "negative-control"
    checkpoint = tmp_path / "checkpoint"

    assert run(spark, bootstrap, src, out, checkpoint) == [(0, 12), (1, 12), (2, 6)]
    assert values(spark, bootstrap, out) == Counter(sent)

    forget_last_commit(checkpoint)
    # The replay really happens: Spark runs batch 2 again, with its 6 rows.
    assert run(spark, bootstrap, src, out, checkpoint) == [(2, 6)]
    after = values(spark, bootstrap, out)
    replayed = Counter(v for v, n in after.items() if n > 1)
    if fenced:
        assert after == Counter(sent)  # every record exactly once
        # The replay wrote nothing at all, not even an aborted transaction's records.
        assert values(spark, bootstrap, out, "read_uncommitted") == Counter(sent)
    else:
        assert sum(after.values()) == RECORDS + 6 and len(replayed) == 6  # batch 2 twice
