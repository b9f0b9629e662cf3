"""Kafka's consumer protocol as raftbroker's consumers speak it: byte for byte what aiokafka
writes, readable from every version kafka-python writes, and the range assignor deciding as
aiokafka's does (a native member and a Kafka client may lead each other's group)."""

from __future__ import annotations

import random
from collections.abc import Mapping

import pytest
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from cluster.client.consumer_protocol import (
    ConsumerProtocolError,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    range_assign,
)

TOPIC_SETS = [[], ["orders"], ["b", "a", "ünïcode"], [f"t{i}" for i in range(40)]]


@pytest.mark.parametrize("topics", TOPIC_SETS)
def test_a_subscription_is_aiokafkas_bytes_and_reads_back(topics: list[str]) -> None:
    theirs = ConsumerProtocolMemberMetadata(0, sorted(topics), b"").encode()
    assert encode_subscription(topics) == theirs
    assert decode_subscription(theirs) == tuple(sorted(topics))


def test_an_assignment_is_aiokafkas_bytes_and_reads_back() -> None:
    ours = {"b": (3, 1), "a": (0,), "c": ()}
    theirs = ConsumerProtocolMemberAssignment(
        0, [("a", [0]), ("b", [1, 3]), ("c", [])], b""
    ).encode()
    assert encode_assignment(ours) == theirs
    assert decode_assignment(theirs) == {"a": (0,), "b": (1, 3), "c": ()}
    assert decode_assignment(b"") == {}  # what a member without partitions may be sent


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_every_version_kafka_python_writes_is_read(version: int) -> None:
    from kafka.protocol.consumer.metadata import (  # noqa: PLC0415
        ConsumerProtocolAssignment,
        ConsumerProtocolSubscription,
    )

    subscription = ConsumerProtocolSubscription(
        version=version, topics=["x", "y"], user_data=b"u"
    ).encode(version=version)
    assert decode_subscription(subscription) == ("x", "y")
    if version <= 1:  # the assignment has versions 0 and 1 (KIP-429)
        assignment = ConsumerProtocolAssignment(
            version=version,
            assigned_partitions=[("x", [2, 0])],
            user_data=None,
        ).encode(version=version)
        assert decode_assignment(assignment) == {"x": (2, 0)}


def test_bytes_that_are_not_a_whole_body_are_refused_with_one_error() -> None:
    whole = encode_assignment({"orders": (0, 1, 2)})
    for cut in range(2, len(whole) - 4):  # every truncation inside the topics
        with pytest.raises(ConsumerProtocolError):
            decode_assignment(whole[:cut])
    with pytest.raises(ConsumerProtocolError):
        decode_subscription(b"\x00\x00\x7f\xff\xff\xff")  # an array far longer than its bytes
    with pytest.raises(ConsumerProtocolError):
        decode_subscription(b"\x00\x00\x00\x00\x00\x01\x00\x02\xff\xfe")  # not UTF-8


class _Cluster:
    def __init__(self, counts: Mapping[str, int]) -> None:
        self.counts = counts

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        count = self.counts.get(topic)
        return None if count is None else set(range(count))


def test_the_range_assignor_decides_as_aiokafkas() -> None:
    rng = random.Random(7)
    for _ in range(300):
        topics = [f"t{i}" for i in range(rng.randint(1, 4))]
        counts = {t: rng.randint(1, 9) for t in topics if rng.random() < 0.9}
        members = {
            f"m-{rng.randrange(10**6):06d}": rng.sample(topics, rng.randint(1, len(topics)))
            for _ in range(rng.randint(1, 6))
        }
        theirs = RangePartitionAssignor.assign(
            _Cluster(counts),
            {m: ConsumerProtocolMemberMetadata(0, ts, b"") for m, ts in members.items()},
        )
        ours = range_assign(members, counts)
        assert set(ours) == set(theirs)
        for member, assignment in ours.items():
            expected = {t: tuple(ps) for t, ps in theirs[member].assignment if ps}
            assert assignment == expected, (members, counts)
