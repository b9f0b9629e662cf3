"""Batch reads against a real cluster: offsets, headers, producer identity, splitting, errors."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from cluster.client.sync import SyncClient
from tests.pipeline.conftest import new_topic, produce

pytestmark = pytest.mark.spark


def reader(spark: SparkSession, bootstrap: str, **options: str) -> DataFrame:
    return (
        spark.read.format("raftbroker")
        .option("raftbroker.bootstrap.servers", bootstrap)
        .options(**options)
        .load()
    )


def rows_of(df: DataFrame) -> list[dict[str, Any]]:
    return sorted((r.asDict() for r in df.collect()), key=lambda r: (r["partition"], r["offset"]))


def test_batch_read_between_starting_and_ending_offsets(
    spark: SparkSession, client: SyncClient, bootstrap: str
) -> None:
    topic = new_topic(client, 2)
    headers = (("trace", b"\x00\x01"),)
    produce(client, topic, [b"a%d" % i for i in range(6)], partition=0, headers=headers)
    produce(client, topic, [b"b%d" % i for i in range(4)], partition=1, headers=headers)
    df = reader(
        spark,
        bootstrap,
        subscribe=topic,
        startingOffsets=json.dumps({topic: {"0": 2, "1": -2}}),
        endingOffsets=json.dumps({topic: {"0": 5, "1": -1}}),
        includeHeaders="true",
    )
    assert df.columns == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType",
        "headers", "producerId", "producerEpoch", "sequence",
    ]  # fmt: skip
    rows = rows_of(df)
    got = [(r["partition"], r["offset"], r["key"], r["value"]) for r in rows]
    assert got == [(0, n, b"a%d" % n, b"a%d" % n) for n in (2, 3, 4)] + [
        (1, n, b"b%d" % n, b"b%d" % n) for n in range(4)
    ]
    for r in rows:
        assert r["topic"] == topic and r["timestampType"] == 0 and r["timestamp"] is not None
        assert [(h["key"], bytes(h["value"])) for h in r["headers"]] == [("trace", b"\x00\x01")]
        # One idempotent producer per partition here: its sequence counts from 0 as offsets do.
        assert r["producerId"] >= 0 and r["sequence"] == r["offset"]
    assert len({r["producerId"] for r in rows if r["partition"] == 0}) == 1


def test_min_partitions_splits_offset_ranges(
    spark: SparkSession, client: SyncClient, bootstrap: str
) -> None:
    topic = new_topic(client, 1)
    produce(client, topic, [b"v%d" % i for i in range(40)], partition=0)
    df = reader(spark, bootstrap, subscribe=topic, minPartitions="4")
    assert df.rdd.getNumPartitions() == 4
    assert [r["offset"] for r in rows_of(df)] == list(range(40))
    whole = reader(spark, bootstrap, subscribe=topic)
    assert whole.rdd.getNumPartitions() == 1


def test_subscribe_pattern_and_assign(
    spark: SparkSession, client: SyncClient, bootstrap: str
) -> None:
    first, second = new_topic(client, 1, "pat"), new_topic(client, 2, "pat")
    produce(client, first, [b"x"], partition=0)
    produce(client, second, [b"y"], partition=1)
    by_pattern = reader(spark, bootstrap, subscribePattern=f"({first}|{second})")
    assert {(r["topic"], r["value"]) for r in rows_of(by_pattern)} == {
        (first, b"x"),
        (second, b"y"),
    }
    assigned = reader(spark, bootstrap, assign=json.dumps({second: [0]}))
    assert rows_of(assigned) == []


BAD_OPTIONS: list[tuple[dict[str, str], str]] = [
    ({}, "exactly one of subscribe, subscribePattern, assign is needed"),
    ({"subscribe": "no-such-topic"}, "topic(s) do not exist: no-such-topic"),
    (
        {"subscribe": "TOPIC", "startingOffsets": "latest"},
        "'latest' is not allowed in a batch read",
    ),
    ({"subscribe": "TOPIC", "endingOffsets": '{"TOPIC": {"0": 999}}'}, "past its committed end 0"),
    (
        {"subscribe": "TOPIC", "startingOffsets": '{"TOPIC": {"1": 0}}'},
        "an offset for every partition",
    ),
]


@pytest.mark.parametrize(("options", "message"), BAD_OPTIONS)
def test_bad_options_fail_with_a_clear_message(
    spark: SparkSession, client: SyncClient, bootstrap: str, options: dict[str, str], message: str
) -> None:
    topic = new_topic(client, 1)
    named = {k: v.replace("TOPIC", topic) for k, v in options.items()}
    with pytest.raises(PySparkException, match=re.escape(message)):
        reader(spark, bootstrap, **named).collect()
