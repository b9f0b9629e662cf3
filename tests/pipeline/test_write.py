"""Batch writes through the idempotent producer, read back: every row once, where it belongs."""

from __future__ import annotations

import re
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
)

from cluster.client import stable_partition
from cluster.client.sync import SyncClient
from tests.pipeline.conftest import new_topic
from tests.polling import poll_until

pytestmark = pytest.mark.spark
InputRow = tuple[str, str | None, bytes, int | None, list[tuple[str, bytes]]]

HEADER = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("key", StringType()),
        StructField("value", BinaryType()),
        StructField("partition", IntegerType()),
        StructField("headers", ArrayType(HEADER)),
    ]
)


def read_back(
    spark: SparkSession, bootstrap: str, topic: str, isolation: str = "read_committed"
) -> list[dict[str, Any]]:
    df = (
        spark.read.format("raftbroker")
        .option("raftbroker.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .option("raftbroker.isolation.level", isolation)
        .load()
    )
    return [r.asDict(recursive=True) for r in df.collect()]


def save(df: DataFrame, bootstrap: str, **options: str) -> None:
    writer = df.write.format("raftbroker").mode("append")
    writer.option("raftbroker.bootstrap.servers", bootstrap).options(**options).save()


def test_batch_write_appends_each_row_once_where_it_belongs(
    spark: SparkSession, client: SyncClient, bootstrap: str
) -> None:
    topic = new_topic(client, 3)
    keyed: list[InputRow] = [
        (topic, f"k{i}", b"keyed-%d" % i, None, [("h", b"%d" % i)]) for i in range(30)
    ]
    pinned: list[InputRow] = [(topic, None, b"pinned-%d" % i, 2, []) for i in range(10)]
    df = spark.createDataFrame(keyed + pinned, SCHEMA).repartition(2)
    save(df, bootstrap)

    rows = read_back(spark, bootstrap, topic)
    assert sorted(bytes(r["value"]) for r in rows) == sorted(v for _, _, v, _, _ in keyed + pinned)
    for r in rows:
        value = bytes(r["value"])
        if value.startswith(b"keyed"):
            assert r["partition"] == stable_partition(r["key"], 3)
            assert [(h["key"], bytes(h["value"])) for h in r["headers"]] == [
                ("h", value.rsplit(b"-", 1)[1])
            ]
        else:
            assert r["partition"] == 2 and r["key"] is None
    # Idempotent producers (one per task): (producerId, partition, sequence) names each record.
    identities = {(r["producerId"], r["partition"], r["sequence"]) for r in rows}
    assert len(identities) == len(rows) and all(pid >= 0 for pid, _, _ in identities)


def test_topic_option_and_string_values(
    spark: SparkSession, client: SyncClient, bootstrap: str
) -> None:
    topic = new_topic(client, 1)
    df = spark.createDataFrame([("one",), ("two",)], "value string")
    save(df, bootstrap, topic=topic)
    assert sorted(bytes(r["value"]) for r in read_back(spark, bootstrap, topic)) == [
        b"one",
        b"two",
    ]


@pytest.mark.parametrize(
    ("ddl", "options", "message"),
    [
        ("vaule binary", {"topic": "x"}, "cannot write column(s) ['vaule']"),
        ("key binary", {"topic": "x"}, "a 'value' column (binary or string) is required"),
        ("value binary", {}, "give the topic: the 'topic' option or a 'topic' column"),
        ("value int", {"topic": "x"}, "column 'value' must be binary or string, not int"),
    ],
)
def test_bad_writes_fail_with_a_clear_message(
    spark: SparkSession, bootstrap: str, ddl: str, options: dict[str, str], message: str
) -> None:
    df = spark.createDataFrame([], ddl)
    with pytest.raises(PySparkException, match=re.escape(message)):
        save(df, bootstrap, **options)


def test_overwrite_is_refused(spark: SparkSession, bootstrap: str) -> None:
    df = spark.createDataFrame([], "value binary")
    writer = df.write.format("raftbroker").mode("overwrite").option("topic", "x")
    with pytest.raises(PySparkException, match="save mode 'overwrite' is not allowed"):
        writer.option("raftbroker.bootstrap.servers", bootstrap).save()


# A task sends its rows 1,000 at a time, as Spark hands them over, in batches of thousands:
# many have gone out when the row near the end fails.
FAILING_ROWS = 30_000


def test_a_transactional_write_leaves_nothing_of_a_failed_task_to_read_committed_readers(
    spark: SparkSession, client: SyncClient, bootstrap: str
) -> None:
    topic = new_topic(client, 1)

    def fail_late(index: int) -> bytes:
        if index == FAILING_ROWS - 100:
            raise RuntimeError("the task fails after most of its rows went out")
        return b"row-%d" % index

    def row(index: int) -> InputRow:
        return (topic, None, fail_late(index), 0, [])

    rows = spark.sparkContext.parallelize(range(FAILING_ROWS), 1).map(row)
    with pytest.raises(PySparkException, match="the task fails"):
        save(spark.createDataFrame(rows, SCHEMA), bootstrap,
             **{"raftbroker.transactional.id.prefix": f"job-{topic}"})  # fmt: skip
    # The driver aborted the failed task's transaction (its input had ended early, as its
    # upstream failed: the task prepared it): nothing left open holds the partition's last
    # stable offset back, and nothing of it is read committed.
    poll_until(lambda: last_stable_is_end(client, topic), 30, "the transaction's abort")
    assert read_back(spark, bootstrap, topic) == []
    # The negative control: the aborted transaction's records are in the log (how many got
    # out before the failure depends on Spark's batching and the machine's load).
    assert len(read_back(spark, bootstrap, topic, "read_uncommitted")) > 0
    done: list[InputRow] = [(topic, None, b"ok-%d" % i, 0, []) for i in range(10)]
    save(spark.createDataFrame(done, SCHEMA), bootstrap,
         **{"raftbroker.transactional.id.prefix": f"job-{topic}"})  # fmt: skip
    assert sorted(r["value"] for r in read_back(spark, bootstrap, topic)) == sorted(
        b"ok-%d" % i for i in range(10)
    )


def last_stable_is_end(client: SyncClient, topic: str) -> bool:
    admin = client.admin
    stable = client.call(admin.list_offsets(topic, 0, -1, read_committed=True))
    return stable == client.call(admin.list_offsets(topic, 0, -1))
