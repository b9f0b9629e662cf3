"""Kafka's administration of records, configs and group offsets against the Kafka listener:
DeleteRecords, ListOffsets' max timestamp and IncrementalAlterConfigs from confluent-kafka's
AdminClient (librdkafka), and OffsetDelete at the request level (no Python client sends it;
Kafka's own tool does, in test_kafka_tools.py).

- DeleteRecords moves a partition's log start (every replica's: the same entry retention
  proposes): below it, Fetch is OFFSET_OUT_OF_RANGE and ListOffsets earliest is the new start;
  -1 means the high watermark; past it is OFFSET_OUT_OF_RANGE.
- IncrementalAlterConfigs sets and deletes a topic's retention (DescribeConfigs then shows it
  as the topic's own, on every node) and refuses what raftbroker does not do with
  INVALID_CONFIG and the reason; the topic's records stay (a changed config never restarts or
  empties its partitions).
- ListOffsets' max timestamp (-3) names the first record with the largest producer timestamp.
- OffsetDelete removes an empty group's committed offsets, keeps those of a topic a member
  reads (GROUP_SUBSCRIBED_TO_TOPIC), and knows no group that has neither.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from confluent_kafka import Consumer as CkConsumer
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka import Producer as CkProducer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    OffsetSpec,
    ResourceType,
)
from confluent_kafka.cimpl import NewTopic

from cluster.kafka import messages as m
from cluster.local import launcher
from statemachine.errors import ErrorCode
from tests.kafka_wire import kafka_call
from tests.polling import poll_until

TIMEOUT_S = 30.0
RECORDS = 10


@pytest.fixture(scope="module")
def bootstrap(group_cluster: launcher.LocalCluster) -> str:
    return ",".join(group_cluster.kafka_bootstrap)


@pytest.fixture(scope="module")
def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def topic_with_records(admin: AdminClient, bootstrap: str, name: str, partitions: int = 1) -> None:
    """A new topic, replicated 3 times, with RECORDS records in each partition (values
    "p-i")."""
    admin.create_topics([NewTopic(name, partitions, 3)])[name].result(TIMEOUT_S)
    producer = CkProducer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for partition in range(partitions):
        for i in range(RECORDS):
            producer.produce(name, f"{partition}-{i}".encode(), partition=partition)
    assert producer.flush(TIMEOUT_S) == 0


def read_all(bootstrap: str, topic: str, partition: int = 0) -> list[tuple[int, bytes]]:
    """(offset, value) of every record a consumer reads from the partition's earliest offset."""
    consumer = CkConsumer({"bootstrap.servers": bootstrap, "group.id": "unused-readers",
                           "enable.auto.commit": False})  # fmt: skip
    end = consumer.get_watermark_offsets(TopicPartition(topic, partition), TIMEOUT_S)[1]
    consumer.assign([TopicPartition(topic, partition, -2)])  # OFFSET_BEGINNING
    got: list[tuple[int, bytes]] = []

    def caught_up() -> bool:
        for message in consumer.consume(100, 0.2):
            assert message.error() is None, message.error()
            offset, value = message.offset(), message.value()
            assert offset is not None and value is not None
            got.append((offset, value))
        return bool(got) and got[-1][0] == end - 1

    try:
        poll_until(caught_up, TIMEOUT_S, f"{topic}-{partition} read to {end}")
    finally:
        consumer.close()
    return got


def earliest(admin: AdminClient, topic: str) -> int:
    tp = TopicPartition(topic, 0)
    spec = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
    listed = admin.list_offsets({tp: spec})[tp].result(TIMEOUT_S)
    offset: int = listed.offset
    return offset


def delete_records(admin: AdminClient, topic: str, offset: int) -> int:
    tp = TopicPartition(topic, 0, offset)
    low_watermark: int = admin.delete_records([tp])[tp].result(TIMEOUT_S).low_watermark
    return low_watermark


def test_delete_records_moves_the_log_start(admin: AdminClient, bootstrap: str) -> None:
    topic_with_records(admin, bootstrap, "deleted-records")
    assert delete_records(admin, "deleted-records", 4) == 4
    assert earliest(admin, "deleted-records") == 4
    assert [offset for offset, _ in read_all(bootstrap, "deleted-records")] == list(range(4, 10))
    assert delete_records(admin, "deleted-records", 2) == 4, "never back"
    with pytest.raises(KafkaException, match="OFFSET_OUT_OF_RANGE"):
        delete_records(admin, "deleted-records", RECORDS + 1)
    assert delete_records(admin, "deleted-records", -1) == RECORDS, "-1: the high watermark"
    assert earliest(admin, "deleted-records") == RECORDS


def test_a_fetch_below_the_deleted_records_is_out_of_range(
    admin: AdminClient, bootstrap: str
) -> None:
    topic_with_records(admin, bootstrap, "fetched-below")
    delete_records(admin, "fetched-below", 6)
    answers = asyncio.run(fetch_everywhere(bootstrap.split(","), "fetched-below", 3))
    # Only the leader answers a Fetch; the others send the client to it.
    assert sorted(answers) == [
        ErrorCode.OFFSET_OUT_OF_RANGE,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ]


async def fetch_everywhere(addresses: list[str], topic: str, offset: int) -> list[int]:
    want = m.FetchRequest(0, 0, (m.FetchTopic(topic, (m.FetchPartition(0, offset, 1 << 20),)),))
    answers = []
    for address in addresses:
        answer = await kafka_call(address, m.Api.FETCH, 12, want)
        assert isinstance(answer, m.FetchResponse)
        answers.append(answer.responses[0].partitions[0].error_code)
    return answers


def test_list_offsets_finds_the_record_with_the_largest_timestamp(
    admin: AdminClient, bootstrap: str
) -> None:
    """ListOffsets v7's max timestamp (-3, KIP-734; librdkafka's OffsetSpec.max_timestamp):
    the first record carrying the largest producer timestamp, inside its batch; an empty
    partition's is -1 at -1."""
    for name in ("stamped", "stamped-empty"):
        admin.create_topics([NewTopic(name, 1, 3)])[name].result(TIMEOUT_S)
    producer = CkProducer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                           "linger.ms": 50})  # fmt: skip
    for i, timestamp in enumerate((1_000, 2_000, 9_000, 3_000, 9_000, 4_000)):
        producer.produce("stamped", f"v{i}".encode(), partition=0, timestamp=timestamp)
    assert producer.flush(TIMEOUT_S) == 0
    tp = TopicPartition("stamped", 0)
    spec = OffsetSpec.max_timestamp()  # type: ignore[no-untyped-call]
    found = admin.list_offsets({tp: spec})[tp].result(TIMEOUT_S)
    assert (found.offset, found.timestamp) == (2, 9_000)
    # Deleted records no longer count, even inside the batch that holds the log start.
    for start, expected in ((3, (4, 9_000)), (5, (5, 4_000))):
        delete_records(admin, "stamped", start)
        found = admin.list_offsets({tp: spec})[tp].result(TIMEOUT_S)
        assert (found.offset, found.timestamp) == expected
    asked = m.ListOffsetsPartition(0, -3)
    request = m.ListOffsetsRequest((m.ListOffsetsTopic("stamped-empty", (asked,)),))

    def empty() -> m.ListOffsetsPartitionResponse | None:
        for address in bootstrap.split(","):
            answer = asyncio.run(kafka_call(address, m.Api.LIST_OFFSETS, 7, request))
            assert isinstance(answer, m.ListOffsetsResponse)
            result = answer.topics[0].partitions[0]
            if result.error_code == ErrorCode.NONE:
                return result
        return None

    result = poll_until(empty, TIMEOUT_S, "the empty partition's leader")
    assert (result.offset, result.timestamp) == (-1, -1)
    older = asyncio.run(
        kafka_call(bootstrap.split(",", maxsplit=1)[0], m.Api.LIST_OFFSETS, 6, request)
    )
    assert isinstance(older, m.ListOffsetsResponse)
    assert older.topics[0].partitions[0].error_code == ErrorCode.UNSUPPORTED_VERSION, "v7 only"


def alter(admin: AdminClient, topic: str, *entries: ConfigEntry, validate: bool = False) -> None:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    for entry in entries:
        resource.add_incremental_config(entry)
    admin.incremental_alter_configs([resource], validate_only=validate)[resource].result(TIMEOUT_S)


def configs_everywhere(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    """The topic's configs as each node describes them."""
    resource = ConfigResource(ResourceType.TOPIC, topic)
    found = []
    for address in bootstrap.split(","):
        one = AdminClient({"bootstrap.servers": address})
        found.append(one.describe_configs([resource])[resource].result(TIMEOUT_S))
    return found


def set_(name: str, value: str) -> ConfigEntry:
    return ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)


def test_a_topics_retention_is_altered_and_the_rest_refused(
    admin: AdminClient, bootstrap: str
) -> None:
    topic_with_records(admin, bootstrap, "altered", partitions=2)
    alter(admin, "altered", set_("retention.ms", "3600000"), set_("cleanup.policy", "delete"))

    def everywhere(name: str, value: str) -> bool:
        return all(c[name].value == value for c in configs_everywhere(bootstrap, "altered"))

    poll_until(lambda: everywhere("retention.ms", "3600000"), TIMEOUT_S, "the new retention")
    assert not configs_everywhere(bootstrap, "altered")[0]["retention.ms"].is_default
    alter(admin, "altered", set_("retention.bytes", "1000000"), validate=True)
    assert everywhere("retention.bytes", "-1"), "validate_only changes nothing"
    with pytest.raises(KafkaException, match=r"INVALID_CONFIG.*never compacted"):
        alter(admin, "altered", set_("cleanup.policy", "compact"))
    with pytest.raises(KafkaException, match=r"INVALID_CONFIG.*Raft majority"):
        alter(admin, "altered", set_("min.insync.replicas", "1"))
    with pytest.raises(KafkaException, match=r"INVALID_CONFIG.*unknown topic config"):
        alter(admin, "altered", set_("segment.bytes", "1000"))
    with pytest.raises(KafkaException, match="INVALID_CONFIG"):
        alter(admin, "altered", set_("retention.ms", "soon"))
    deleted = ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)
    alter(admin, "altered", deleted)
    poll_until(lambda: everywhere("retention.ms", "-1"), TIMEOUT_S, "the default retention")
    for partition in range(2):  # the partitions kept their records through both changes
        read = [value for _, value in read_all(bootstrap, "altered", partition)]
        assert read == [f"{partition}-{i}".encode() for i in range(RECORDS)]


def offset_delete(address: str, group: str, topic: str, partitions: tuple[int, ...]) -> Any:
    asked = tuple(m.OffsetDeleteRequestPartition(p) for p in partitions)
    request = m.OffsetDeleteRequest(group, (m.OffsetDeleteRequestTopic(topic, asked),))
    return asyncio.run(kafka_call(address, m.Api.OFFSET_DELETE, 0, request))


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    consumer = CkConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        asked = [TopicPartition(topic, p) for p in range(partitions)]
        return [tp.offset for tp in consumer.committed(asked, TIMEOUT_S)]
    finally:
        consumer.close()


def coordinator(bootstrap: str, group: str) -> str:
    answer = asyncio.run(
        kafka_call(
            bootstrap.split(",", maxsplit=1)[0],
            m.Api.FIND_COORDINATOR,
            2,
            m.FindCoordinatorRequest(group),
        )
    )
    assert isinstance(answer, m.FindCoordinatorResponse) and answer.error_code == 0, answer
    return f"{answer.host}:{answer.port}"


def test_offset_delete_removes_an_empty_groups_offsets(admin: AdminClient, bootstrap: str) -> None:
    topic_with_records(admin, bootstrap, "offsets-deleted", partitions=2)
    commit = [TopicPartition("offsets-deleted", p, 7) for p in range(2)]
    done = admin.alter_consumer_group_offsets([_group_offsets("od-group", commit)])
    done["od-group"].result(TIMEOUT_S)
    assert committed(bootstrap, "od-group", "offsets-deleted", 2) == [7, 7]
    answer = offset_delete(coordinator(bootstrap, "od-group"), "od-group", "offsets-deleted", (0,))
    assert answer.error_code == 0
    assert [(p.partition_index, p.error_code) for p in answer.topics[0].partitions] == [(0, 0)]
    assert committed(bootstrap, "od-group", "offsets-deleted", 2) == [-1001, 7]
    unknown = offset_delete(coordinator(bootstrap, "no-group"), "no-group", "offsets-deleted", (0,))
    assert unknown.error_code == ErrorCode.GROUP_ID_NOT_FOUND


def test_offset_delete_keeps_what_a_member_reads(admin: AdminClient, bootstrap: str) -> None:
    topic_with_records(admin, bootstrap, "offsets-read", partitions=1)
    topic_with_records(admin, bootstrap, "offsets-unread", partitions=1)
    unread_offset = [TopicPartition("offsets-unread", 0, 5)]  # committed while the group is empty
    done = admin.alter_consumer_group_offsets([_group_offsets("od-member", unread_offset)])
    done["od-member"].result(TIMEOUT_S)
    member = CkConsumer({"bootstrap.servers": bootstrap, "group.id": "od-member",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    member.subscribe(["offsets-read"])
    try:
        poll_until(lambda: bool(member.consume(10, 0.2)), TIMEOUT_S, "the member reading")
        member.commit(offsets=[TopicPartition("offsets-read", 0, 3)], asynchronous=False)
        address = coordinator(bootstrap, "od-member")
        read = offset_delete(address, "od-member", "offsets-read", (0,))
        assert read.topics[0].partitions[0].error_code == ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
        unread = offset_delete(address, "od-member", "offsets-unread", (0,))
        assert unread.topics[0].partitions[0].error_code == ErrorCode.NONE
        missing = offset_delete(address, "od-member", "no-such-topic", (0,))
        assert missing.topics[0].partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert committed(bootstrap, "od-member", "offsets-read", 1) == [3]
        assert committed(bootstrap, "od-member", "offsets-unread", 1) == [-1001]
    finally:
        member.close()


def _group_offsets(group: str, offsets: list[TopicPartition]) -> Any:
    from confluent_kafka import ConsumerGroupTopicPartitions  # noqa: PLC0415

    return ConsumerGroupTopicPartitions(group, offsets)
