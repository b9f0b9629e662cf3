"""Issue 19, defect 10: a partition that does not exist is UNKNOWN_TOPIC_OR_PARTITION.

A Produce to a topic that does not exist was answered NOT_LEADER_OR_FOLLOWER, which tells a
client that another node leads it: clients retried for minutes. Every node now answers from its
metadata that the topic, or the partition past the topic's count, does not exist, in Produce,
Fetch, ListOffsets and DescribeProducers alike; a partition that exists but is led elsewhere is
still NOT_LEADER_OR_FOLLOWER, with a hint.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from cluster import native as p
from cluster.client import Admin, Client, ClientError, Producer, ProducerConfig
from cluster.config import Limits
from statemachine.errors import ErrorCode
from tests.adversarial.conftest import (
    KNOWN_PARTITIONS,
    KNOWN_TOPIC,
    Known,
    assert_intact,
    exchange,
    leaders,
)
from tests.builders import plain_batch

pytestmark = pytest.mark.asyncio(loop_scope="function")

BUDGET_BYTES = Limits().fetch_bytes_max
UNKNOWN = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
PER_PARTITION_ANSWERS = (
    p.ProduceResponse,
    p.FetchResponse,
    p.ListOffsetsResponse,
    p.DescribeProducersResponse,
)
# A producer's sends to a deleted topic fail within this (its delivery timeout is 120 s).
GONE_WITHIN_S = 15.0
ABSENT = [("no-such-topic", 0), (KNOWN_TOPIC, KNOWN_PARTITIONS)]


def _asking_for(topic: str, partition: int) -> list[p.Request]:
    return [
        p.Produce(1_000, (p.ProduceEntry(topic, partition, plain_batch()),)),
        p.Fetch(0, BUDGET_BYTES, (p.FetchPartition(topic, partition, 0, BUDGET_BYTES),), False),
        p.ListOffsets((p.OffsetQuery(topic, partition, p.LATEST),)),
        p.DescribeProducers(topic, (partition,)),
    ]


def _errors(answers: list[p.Response | p.ErrorResponse]) -> list[tuple[ErrorCode, str]]:
    """Each answer's one partition result: its error and leader hint."""
    found = []
    for answer in answers:
        assert isinstance(answer, PER_PARTITION_ANSWERS), answer
        (result,) = answer.results
        found.append((ErrorCode(result.error), result.leader))
    return found


@pytest.mark.parametrize(("topic", "partition"), ABSENT, ids=["no such topic", "no such partition"])
async def test_a_partition_that_does_not_exist_is_unknown_on_every_node(
    known: Known, topic: str, partition: int
) -> None:
    for node in known.cluster.nodes:
        answers = await exchange(node.client_address, _asking_for(topic, partition))
        assert _errors(answers) == [(UNKNOWN, "")] * len(answers), node.client_address
    await assert_intact(known)


async def test_a_partition_led_elsewhere_is_still_not_leader_with_a_hint(
    known: Known, client: Client
) -> None:
    leader = (await leaders(client, KNOWN_TOPIC))[0]
    follower = next(n for n in known.cluster.nodes if n.client_address != leader)
    requests = _asking_for(KNOWN_TOPIC, 0)[1:]  # not a Produce: the known records stay as they are
    answers = await exchange(follower.client_address, requests)
    assert _errors(answers) == [(ErrorCode.NOT_LEADER_OR_FOLLOWER, leader)] * len(answers)
    await assert_intact(known)


async def test_a_producer_whose_topic_is_deleted_fails_at_once(
    known: Known, client: Client
) -> None:
    """Sends to a deleted topic fail with UNKNOWN_TOPIC_OR_PARTITION as soon as metadata says
    the topic is gone, not after retrying for the whole delivery timeout (two minutes).

    A deletion reaches the partition's leader when that node's metadata replica applies it (as
    in Kafka, DeleteTopic answers once the metadata group committed it), so a send racing it
    may still be acknowledged; the producer keeps sending until the refusal comes."""
    topic = "deleted-under-a-producer"
    await Admin(client).create_topic(topic, 1, 3)
    config = ProducerConfig(delivery_timeout_ms=120_000)
    async with Producer(client, config) as producer:
        first = await (await producer.send(topic, b"before", partition=0))
        assert first.offset == 0
        await Admin(client).delete_topic(topic)
        started = time.monotonic()
        with pytest.raises(ClientError) as caught:
            await _send_until_refused(producer, topic)
    assert caught.value.error == UNKNOWN
    assert time.monotonic() - started < GONE_WITHIN_S
    await assert_intact(known)


async def _send_until_refused(producer: Producer, topic: str) -> None:
    async with asyncio.timeout(GONE_WITHIN_S):
        while True:
            await (await producer.send(topic, b"after", partition=0))
