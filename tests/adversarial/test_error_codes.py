"""Issue 19, defect 10: a partition that does not exist is UNKNOWN_TOPIC_OR_PARTITION.

A Produce to a topic that does not exist was answered NOT_LEADER_OR_FOLLOWER, which tells a
client that another node leads it: clients retried for minutes. Every node now answers from its
metadata that the topic, or the partition past the topic's count, does not exist, in Produce,
Fetch, ListOffsets and DescribeProducers alike; a partition that exists but is led elsewhere is
still NOT_LEADER_OR_FOLLOWER, with a hint.
"""

from __future__ import annotations

import pytest

from cluster import protocol as p
from cluster.client import Cluster
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
    known: Known, client: Cluster
) -> None:
    leader = (await leaders(client, KNOWN_TOPIC))[0]
    follower = next(n for n in known.cluster.nodes if n.client_address != leader)
    requests = _asking_for(KNOWN_TOPIC, 0)[1:]  # not a Produce: the known records stay as they are
    answers = await exchange(follower.client_address, requests)
    assert _errors(answers) == [(ErrorCode.NOT_LEADER_OR_FOLLOWER, leader)] * len(answers)
    await assert_intact(known)
