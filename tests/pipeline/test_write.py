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


def read_back(spark: SparkSession, bootstrap: str, topic: str) -> list[dict[str, Any]]:
    df = (
        spark.read.format("raftbroker")
        .option("raftbroker.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
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
