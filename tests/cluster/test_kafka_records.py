"""Records through the Kafka listener of a real 3-node cluster (one per module).

Each of confluent-kafka (librdkafka), kafka-python and aiokafka: an idempotent producer with
acks=all sends records with keys, null keys and headers (in each compression codec it
supports), and a consumer with manual assignment (no consumer group: librdkafka's consumer,
which wants a group.id, asks FindCoordinator for it now and then and is told
COORDINATOR_NOT_AVAILABLE, quietly) reads them all back byte for byte, each partition's offsets
contiguous from 0. Records cross protocols both ways. At the request level: a fenced epoch is
refused INVALID_PRODUCER_EPOCH in every Produce version, acks=0 is never answered, a follower
sends a producer to the leader (NOT_LEADER_OR_FOLLOWER, the leader in v10+), a bad batch is
refused and appends nothing, and Fetch waits for max_wait / min_bytes.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer as CkConsumer
from confluent_kafka import KafkaError, TopicPartition
from confluent_kafka import Producer as CkProducer
from crc32c import crc32c
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition

from cluster.client import Admin, Client, ConsumedRecord, Consumer, Producer
from cluster.kafka import codec
from cluster.kafka import messages as m
from cluster.local import launcher
from statemachine.errors import ErrorCode
from statemachine.records import Record, RecordBatch
from tests.kafka_wire import (
    Captured,
    calls_on,
    kafka_call,
    kafka_calls,
    negotiated,
    open_kafka,
    read_kafka_frame,
    report,
    served_init,
)
from tests.polling import apoll_until, poll_until

CLIENT_TIMEOUT_S = 30.0
RECORDS = 300
PARTITIONS = 3
# (key, value, headers) as a Kafka client gives them back: a header value is bytes.
Sent = tuple[bytes | None, bytes, tuple[tuple[str, bytes], ...]]


def records(tag: str, count: int = RECORDS) -> list[Sent]:
    """Keys (every seventh null), values and headers (none, one, or two with an empty value)."""
    made: list[Sent] = []
    for i in range(count):
        key = None if i % 7 == 0 else f"{tag}-k{i}".encode()
        value = f"{tag}-v{i}-".encode() + bytes(range(i % 50))
        headers = tuple((f"h{j}", b"" if j else f"{tag}-{i}".encode()) for j in range(i % 3))
        made.append((key, value, headers))
    return made


def create(three_nodes: launcher.LocalCluster, topic: str, partitions: int = PARTITIONS) -> None:
    async def made() -> None:
        client = Client(three_nodes.bootstrap, request_timeout_s=10.0)
        try:
            await Admin(client).create_topic(topic, partitions, 3)
        finally:
            await client.close()

    asyncio.run(made())


def check_read_back(
    sent: list[Sent],
    read: list[tuple[int, int, bytes | None, bytes, tuple[tuple[str, bytes], ...]]],
) -> None:
    """Every record once, byte for byte; each partition's offsets 0, 1, 2, ..."""
    assert Counter((k, v, h) for _, _, k, v, h in read) == Counter(sent)
    by_partition: dict[int, list[int]] = {}
    for partition, offset, *_ in read:
        by_partition.setdefault(partition, []).append(offset)
    for partition, offsets in by_partition.items():
        assert sorted(offsets) == list(range(len(offsets))), f"partition {partition}"


# -- confluent-kafka (librdkafka) --------------------------------------------------------------


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_kafka_round_trip(
    three_nodes: launcher.LocalCluster, kafka_bootstrap: list[str], captured: Captured, codec: str
) -> None:
    topic = f"ck-{codec}"
    create(three_nodes, topic)
    logs: dict[str, Any] = {"debug": "protocol", "logger": logging.getLogger("librdkafka")}
    producer = CkProducer(
        {
            "bootstrap.servers": ",".join(kafka_bootstrap),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "compression.type": codec,
            **logs,
        }
    )
    failed: list[KafkaError] = []

    def delivered(error: KafkaError | None, _message: object) -> None:
        if error is not None:
            failed.append(error)

    sent = records(topic)
    for key, value, headers in sent:
        producer.produce(topic, value, key, headers=list(headers), on_delivery=delivered)
    assert producer.flush(CLIENT_TIMEOUT_S) == 0
    assert failed == []
    consumer = CkConsumer(
        {
            "bootstrap.servers": ",".join(kafka_bootstrap),
            "group.id": "unused: no group API is used with assign()",
            "enable.auto.commit": False,
            **logs,
        }
    )
    consumer.assign([TopicPartition(topic, n, 0) for n in range(PARTITIONS)])
    read: list[Any] = []

    def all_read() -> bool:
        message = consumer.poll(0.2)
        if message is not None:
            assert message.error() is None, message.error()
            headers = tuple(message.headers() or ())
            read.append(
                (message.partition(), message.offset(), message.key(), message.value(), headers)
            )
        return len(read) >= len(sent)

    try:
        poll_until(all_read, CLIENT_TIMEOUT_S, f"{topic} read back", interval_s=0)
    finally:
        consumer.close()
    check_read_back(sent, read)
    versions = negotiated(captured.lines, r"Sent (\w+)Request \(v(\d+)")
    report(f"confluent-kafka producer and consumer ({codec})", versions)
    assert versions["Produce"] == {10}
    assert versions["Fetch"] == {12}
    assert versions["InitProducerId"] == {4}
    assert versions["FindCoordinator"] == {2}  # the consumer's group.id: not available, quietly


# -- kafka-python ------------------------------------------------------------------------------


# snappy, lz4 and zstd through python-snappy, lz4 and zstandard (the dev extra)
@pytest.mark.parametrize("codec", [None, "gzip", "snappy", "lz4", "zstd"])
def test_kafka_python_round_trip(
    three_nodes: launcher.LocalCluster,
    kafka_bootstrap: list[str],
    captured: Captured,
    codec: str | None,
) -> None:
    topic = f"kp-{codec}"
    create(three_nodes, topic)
    producer = KafkaProducer(
        bootstrap_servers=kafka_bootstrap,
        enable_idempotence=True,
        acks="all",
        compression_type=codec,
    )
    sent = records(topic)
    try:
        futures = [producer.send(topic, value=v, key=k, headers=list(h)) for k, v, h in sent]
        producer.flush(CLIENT_TIMEOUT_S)
        assert all(f.get(CLIENT_TIMEOUT_S).offset >= 0 for f in futures)
    finally:
        producer.close()
    consumer = KafkaConsumer(
        bootstrap_servers=kafka_bootstrap, enable_auto_commit=False, consumer_timeout_ms=500
    )
    read: list[Any] = []
    try:
        consumer.assign([KpTopicPartition(topic, n) for n in range(PARTITIONS)])
        consumer.seek_to_beginning()

        def all_read() -> bool:
            read.extend((r.partition, r.offset, r.key, r.value, tuple(r.headers)) for r in consumer)
            return len(read) >= len(sent)

        poll_until(all_read, CLIENT_TIMEOUT_S, f"{topic} read back")
    finally:
        consumer.close()
    check_read_back(sent, read)
    versions = negotiated(captured.lines, r"Request \d+: (\w+)Request\(version=(\d+)")
    report(f"kafka-python producer and consumer ({codec})", versions)
    assert versions["Produce"] == {9}
    assert versions["Fetch"] == {12}
    assert versions["InitProducerId"] == {4}
    assert versions["ListOffsets"] == {7}


# -- aiokafka ----------------------------------------------------------------------------------


@pytest.mark.asyncio(loop_scope="function")
@pytest.mark.parametrize("codec", [None, "gzip", "snappy", "lz4", "zstd"])  # cramjam: all five
async def test_aiokafka_round_trip(
    three_nodes: launcher.LocalCluster,
    kafka_bootstrap: list[str],
    captured: Captured,
    codec: str | None,
) -> None:
    topic = f"ak-{codec}"
    await asyncio.to_thread(create, three_nodes, topic)
    sent = records(topic)
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap,
        enable_idempotence=True,
        acks="all",
        compression_type=codec,
    )
    await producer.start()
    try:
        acks = [await producer.send(topic, value=v, key=k, headers=list(h)) for k, v, h in sent]
        offsets = [(await ack).offset for ack in acks]
        assert min(offsets) >= 0
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False)
    await consumer.start()
    read: list[Any] = []
    try:
        consumer.assign([AioTopicPartition(topic, n) for n in range(PARTITIONS)])
        await consumer.seek_to_beginning()

        async def all_read() -> bool:
            batches = await consumer.getmany(timeout_ms=200)
            for messages in batches.values():
                read.extend(
                    (r.partition, r.offset, r.key, r.value, tuple(r.headers)) for r in messages
                )
            return len(read) >= len(sent)

        await apoll_until(all_read, CLIENT_TIMEOUT_S, f"{topic} read back")
    finally:
        await consumer.stop()
    check_read_back(sent, read)
    versions = negotiated(captured.lines, r"(\w+?)(?:Request|Response)_v(\d+)\(")
    report(f"aiokafka producer and consumer ({codec})", versions)
    assert versions["Produce"] == {7}
    assert versions["Fetch"] == {11}
    assert versions["InitProducerId"] == {0}
    assert versions["Offset"] == {3}  # ListOffsets


# -- across protocols ----------------------------------------------------------------------------


@pytest.mark.asyncio(loop_scope="function")
async def test_records_cross_protocols_both_ways(
    three_nodes: launcher.LocalCluster, kafka_bootstrap: list[str]
) -> None:
    topic = "crossing"
    await asyncio.to_thread(create, three_nodes, topic, 1)
    native = [(f"n{i}".encode(), f"native-{i}".encode(), (("from", b"native"),)) for i in range(50)]
    kafka = [(f"k{i}".encode(), f"kafka-{i}".encode(), (("from", b"kafka"),)) for i in range(50)]
    client = Client(three_nodes.bootstrap, request_timeout_s=10.0)
    try:
        async with Producer(client) as producer:
            acks = [await producer.send(topic, v, key=k, headers=h) for k, v, h in native]
            await asyncio.gather(*acks)
        kafka_producer = AIOKafkaProducer(
            bootstrap_servers=kafka_bootstrap, enable_idempotence=True
        )
        await kafka_producer.start()
        try:
            for k, v, h in kafka:
                await (await kafka_producer.send(topic, v, key=k, headers=list(h), partition=0))
        finally:
            await kafka_producer.stop()
        consumer = Consumer(client)  # the native consumer reads what a Kafka client wrote
        await consumer.assign(topic)
        natively_read: list[ConsumedRecord] = []

        async def natively_all() -> bool:
            natively_read.extend(await consumer.poll(200))
            return len(natively_read) >= 100

        await apoll_until(natively_all, CLIENT_TIMEOUT_S, "100 records read natively")
    finally:
        await client.close()
    assert [(r.key, r.value, r.headers) for r in natively_read] == native + kafka
    kafka_consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False)
    await kafka_consumer.start()
    kafka_read: list[Any] = []
    try:
        kafka_consumer.assign([AioTopicPartition(topic, 0)])
        await kafka_consumer.seek_to_beginning()

        async def kafka_all() -> bool:
            for messages in (await kafka_consumer.getmany(timeout_ms=200)).values():
                kafka_read.extend((r.key, r.value, tuple(r.headers)) for r in messages)
            return len(kafka_read) >= 100

        await apoll_until(kafka_all, CLIENT_TIMEOUT_S, "100 records read by aiokafka")
    finally:
        await kafka_consumer.stop()
    assert kafka_read == native + kafka


# -- at the request level ------------------------------------------------------------------------


def batch(pid: int, epoch: int, sequence: int, count: int = 1, tag: str = "r") -> bytes:
    made = tuple(
        Record(None, f"{tag}{sequence + i}".encode(), 1_700_000_000_000) for i in range(count)
    )
    return RecordBatch(pid, epoch, sequence, made).encode()


def produce(topic: str, data: bytes, acks: int = -1, partition: int = 0) -> m.ProduceRequest:
    return m.ProduceRequest(
        acks, 10_000, (m.TopicProduceData(topic, (m.PartitionProduceData(partition, data),)),)
    )


async def leader_address(kafka_bootstrap: list[str], topic: str, partition: int = 0) -> str:
    async def found() -> str | None:
        answer = await kafka_call(
            kafka_bootstrap[0],
            m.Api.METADATA,
            12,
            m.MetadataRequest((m.MetadataRequestTopic(topic),)),
        )
        assert isinstance(answer, m.MetadataResponse)
        leader = answer.topics[0].partitions[partition].leader_id
        brokers = {b.node_id: f"{b.host}:{b.port}" for b in answer.brokers}
        return brokers.get(leader)

    return await apoll_until(found, CLIENT_TIMEOUT_S, f"a leader of {topic}-{partition}")


def partition_result(answer: m.ResponseBody) -> m.PartitionProduceResponse:
    assert isinstance(answer, m.ProduceResponse), answer
    ((result,),) = [t.partition_responses for t in answer.responses]
    return result


@pytest.mark.asyncio(loop_scope="function")
async def test_a_fenced_epoch_is_refused_in_every_produce_version(
    three_nodes: launcher.LocalCluster, kafka_bootstrap: list[str]
) -> None:
    topic = "fenced"
    await asyncio.to_thread(create, three_nodes, topic, 1)
    leader = await leader_address(kafka_bootstrap, topic)
    txn = f"zombie-{uuid.uuid4()}"
    init = m.InitProducerIdRequest(txn, 60_000)
    old = await served_init(kafka_bootstrap[1], 4, init)
    pid = old.producer_id
    first = await kafka_call(leader, m.Api.PRODUCE, 9, produce(topic, batch(pid, 0, 0)))
    assert partition_result(first).error_code == ErrorCode.NONE
    new = await served_init(kafka_bootstrap[2], 4, init)
    assert new == m.InitProducerIdResponse(0, pid, 1)
    successor = await kafka_call(leader, m.Api.PRODUCE, 9, produce(topic, batch(pid, 1, 0)))
    assert partition_result(successor).error_code == ErrorCode.NONE
    for version in range(3, 13):
        zombie = await kafka_call(leader, m.Api.PRODUCE, version, produce(topic, batch(pid, 0, 1)))
        assert partition_result(zombie).error_code == ErrorCode.INVALID_PRODUCER_EPOCH, version


@pytest.mark.asyncio(loop_scope="function")
async def test_acks_0_is_never_answered_yet_appended(
    three_nodes: launcher.LocalCluster, kafka_bootstrap: list[str]
) -> None:
    topic = "fire-and-forget"
    await asyncio.to_thread(create, three_nodes, topic, 1)
    leader = await leader_address(kafka_bootstrap, topic)
    reader, writer = await open_kafka(leader)
    try:
        header = m.RequestHeader(m.Api.PRODUCE, 9, 4242, "t")
        writer.write(codec.encode_request(header, produce(topic, batch(-1, -1, -1, 3), acks=0)))
        # the next answer on this connection is the ListOffsets', not the Produce's
        latest = m.ListOffsetsRequest(
            (m.ListOffsetsTopic(topic, (m.ListOffsetsPartition(0, -1),)),)
        )

        async def appended() -> bool:
            (answer,) = await calls_on(reader, writer, [(m.Api.LIST_OFFSETS, 6, latest)])
            assert isinstance(answer, m.ListOffsetsResponse)
            return answer.topics[0].partitions[0].offset == 3

        await apoll_until(appended, CLIENT_TIMEOUT_S, "the acks=0 batch appended")
    finally:
        writer.close()


@pytest.mark.asyncio(loop_scope="function")
async def test_a_follower_names_the_leader_and_a_bad_batch_appends_nothing(
    three_nodes: launcher.LocalCluster, kafka_bootstrap: list[str]
) -> None:
    topic = "led"
    await asyncio.to_thread(create, three_nodes, topic, 1)
    leader = await leader_address(kafka_bootstrap, topic)
    follower = next(a for a in kafka_bootstrap if a != leader)
    leader_id = next(n.node_id for n in three_nodes.nodes if n.kafka_address == leader)
    for version in (3, 9, 10, 12):
        answer = await kafka_call(
            follower, m.Api.PRODUCE, version, produce(topic, batch(-1, -1, -1))
        )
        result = partition_result(answer)
        assert result.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
        if version >= 10:  # KIP-951: where the leader is, so the client need not ask Metadata
            assert result.current_leader.leader_id == leader_id
            assert isinstance(answer, m.ProduceResponse)
            assert [e.node_id for e in answer.node_endpoints] == [leader_id]
    good = batch(-1, -1, -1, 2)
    corrupt_crc = good[:-1] + bytes([good[-1] ^ 1])
    lying_count = good[:57] + (3).to_bytes(4, "big") + good[61:]
    transactional = sealed(good[:21] + (0x10).to_bytes(2, "big") + good[23:])  # no pid
    idempotent = batch(4_242, 0, 0, 1)
    unregistered = sealed(idempotent[:21] + (0x10).to_bytes(2, "big") + idempotent[23:])
    control = sealed(idempotent[:21] + (0x30).to_bytes(2, "big") + idempotent[23:])
    answers = await kafka_calls(
        leader,
        [
            (m.Api.PRODUCE, 9, produce(topic, corrupt_crc)),
            (m.Api.PRODUCE, 9, produce(topic, lying_count)),
            (m.Api.PRODUCE, 9, produce(topic, good + good)),  # two batches: v3+ takes one
            (m.Api.PRODUCE, 9, produce(topic, b"")),
            (m.Api.PRODUCE, 9, produce(topic, transactional)),
            (m.Api.PRODUCE, 9, produce(topic, unregistered)),
            (m.Api.PRODUCE, 9, produce(topic, control)),
            (m.Api.PRODUCE, 9, produce(topic, good, acks=2)),
            (m.Api.PRODUCE, 9, produce(topic, good, partition=5)),
        ],
    )
    codes = [partition_result(a).error_code for a in answers]
    assert codes == [
        ErrorCode.CORRUPT_MESSAGE,
        ErrorCode.CORRUPT_MESSAGE,
        ErrorCode.CORRUPT_MESSAGE,
        ErrorCode.CORRUPT_MESSAGE,
        ErrorCode.CORRUPT_MESSAGE,  # a transactional batch needs a producer id
        ErrorCode.INVALID_TXN_STATE,  # no coordinator registered the partition in a transaction
        ErrorCode.INVALID_RECORD,  # markers are the broker's to write
        ErrorCode.INVALID_REQUIRED_ACKS,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ]
    latest = m.ListOffsetsRequest((m.ListOffsetsTopic(topic, (m.ListOffsetsPartition(0, -1),)),))
    offsets = await kafka_call(leader, m.Api.LIST_OFFSETS, 6, latest)
    assert isinstance(offsets, m.ListOffsetsResponse)
    assert offsets.topics[0].partitions[0].offset == 0, "a refused batch was appended"


@pytest.mark.asyncio(loop_scope="function")
async def test_read_committed_reads_every_committed_record_without_transactions(
    three_nodes: launcher.LocalCluster, kafka_bootstrap: list[str]
) -> None:
    """Isolation level 1 (read_committed, librdkafka's default) on data with no transaction
    open: every committed batch, the last stable offset at the high watermark, no abort; the
    same end from ListOffsets."""
    topic = "committed-reads"
    await asyncio.to_thread(create, three_nodes, topic, 1)
    leader = await leader_address(kafka_bootstrap, topic)
    for tag in ("a", "b"):
        answer = await kafka_call(
            leader, m.Api.PRODUCE, 9, produce(topic, batch(-1, -1, -1, 2, tag))
        )
        assert partition_result(answer).error_code == ErrorCode.NONE
    partition = m.FetchPartition(0, 0, 1 << 20)
    fetch = m.FetchRequest(0, 1, (m.FetchTopic(topic, (partition,)),), isolation_level=1)
    answer = await kafka_call(leader, m.Api.FETCH, 12, fetch)
    assert isinstance(answer, m.FetchResponse)
    (data,) = answer.responses[0].partitions
    assert (data.error_code, data.high_watermark, data.last_stable_offset) == (0, 4, 4)
    assert data.aborted_transactions == ()
    assert data.records is not None and len(data.records) == 2 * len(batch(-1, -1, -1, 2))
    latest = m.ListOffsetsTopic(topic, (m.ListOffsetsPartition(0, -1),))
    offsets = await kafka_call(
        leader, m.Api.LIST_OFFSETS, 6, m.ListOffsetsRequest((latest,), isolation_level=1)
    )
    assert isinstance(offsets, m.ListOffsetsResponse)
    assert offsets.topics[0].partitions[0].offset == 4


@pytest.mark.alone  # no leader change in its long polls
@pytest.mark.asyncio(loop_scope="function")
async def test_fetch_waits_for_max_wait_and_min_bytes(
    three_nodes: launcher.LocalCluster, kafka_bootstrap: list[str]
) -> None:
    topic = "long-poll"
    await asyncio.to_thread(create, three_nodes, topic, 1)
    leader = await leader_address(kafka_bootstrap, topic)
    first = batch(-1, -1, -1, 1, "a")
    answer = await kafka_call(leader, m.Api.PRODUCE, 9, produce(topic, first))
    assert partition_result(answer).error_code == ErrorCode.NONE
    epoch = await leader_epoch(kafka_bootstrap, topic)  # no leader changes in this test

    def fetch(offset: int, max_wait: int, min_bytes: int) -> m.FetchRequest:
        partition = m.FetchPartition(0, offset, 1 << 20)
        return m.FetchRequest(max_wait, min_bytes, (m.FetchTopic(topic, (partition,)),))

    started = time.monotonic()
    empty = await kafka_call(leader, m.Api.FETCH, 12, fetch(1, 400, 1))  # at the end: waits
    assert time.monotonic() - started >= 0.35
    assert isinstance(empty, m.FetchResponse)
    (data,) = empty.responses[0].partitions
    assert (data.error_code, data.high_watermark, data.records) == (0, 1, b"")
    # min_bytes beyond what is there: waits for max_wait, then answers what there is
    started = time.monotonic()
    short = await kafka_call(leader, m.Api.FETCH, 4, fetch(0, 400, 10_000))
    assert time.monotonic() - started >= 0.35
    assert isinstance(short, m.FetchResponse)
    assert short.responses[0].partitions[0].records == with_offset(first, 0, epoch)
    # a batch arriving meanwhile ends the wait at once
    reader, writer = await open_kafka(leader)
    try:
        header = m.RequestHeader(m.Api.FETCH, 12, 1, "t")
        writer.write(codec.encode_request(header, fetch(1, 5_000, 1)))
        await writer.drain()
        started = time.monotonic()
        second = batch(-1, -1, -1, 1, "b")
        assert (
            partition_result(
                await kafka_call(leader, m.Api.PRODUCE, 9, produce(topic, second))
            ).error_code
            == ErrorCode.NONE
        )
        _, woken = codec.decode_response(header, await read_kafka_frame(reader))
        assert time.monotonic() - started < 2.0
    finally:
        writer.close()
    assert isinstance(woken, m.FetchResponse)
    # With its error code: an empty answer across a leader change (seen once, on two loaded
    # test workers) then says so, where the records alone could not tell it from a lost wakeup.
    (data,) = woken.responses[0].partitions
    assert (data.error_code, data.records) == (ErrorCode.NONE, with_offset(second, 1, epoch))


def sealed(data: bytes) -> bytes:
    """A batch with its CRC-32C made right again (after a test changed a field it covers)."""
    return data[:17] + crc32c(data[21:]).to_bytes(4, "big") + data[21:]


def with_offset(data: bytes, offset: int, epoch: int) -> bytes:
    """A batch as the log stores it: its base offset assigned, and as its partition leader
    epoch the term of the entry that appended it."""
    return offset.to_bytes(8, "big") + data[8:12] + epoch.to_bytes(4, "big") + data[16:]


async def leader_epoch(kafka_bootstrap: list[str], topic: str) -> int:
    answer = await kafka_call(
        kafka_bootstrap[0], m.Api.METADATA, 12, m.MetadataRequest((m.MetadataRequestTopic(topic),))
    )
    assert isinstance(answer, m.MetadataResponse)
    return answer.topics[0].partitions[0].leader_epoch
