"""librdkafka rides out leader kills through the Kafka listener, exactly once, in order.

confluent-kafka, idempotent, acks=all: 100,000 records over 3 partitions, paced so that they are
in flight for several seconds; meanwhile the leader of a partition is SIGKILLed and later
restarted, twice. librdkafka is the strict oracle: it raises fatal errors on idempotence
violations (a sequence gap, an epoch it did not expect), so besides its delivery reports the
test reads its error callbacks and its log lines. Every delivery report must be a success, no
fatal or idempotence error may be reported or logged, and each partition must hold each of its
records exactly once, in the order the producer sent them, at the offsets reported.

The kills change leaders while records arrive, so the log then holds batches of several leader
epochs (Raft terms): every stored batch carries its epoch, and OffsetForLeaderEpoch (KIP-320)
answers where each one ends, as Kafka's leader-epoch cache would, checked against the batches
a Fetch returns.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from confluent_kafka import KafkaError, Message
from confluent_kafka import Producer as CkProducer

from cluster.client import Admin, Client, Consumer, ConsumerConfig
from cluster.kafka import messages as m
from cluster.local import launcher
from statemachine.errors import ErrorCode
from tests.cluster.conftest import running_cluster
from tests.cluster.procs import partition_leader
from tests.kafka_wire import Captured, kafka_call
from tests.polling import apoll_until

TOPIC = "kafka-leader-kills"
PARTITIONS = 3
RECORDS = 100_000
RATE_PER_S = 12_500  # 8 s of sending: both kills and restarts fall inside it
# At these record counts (sent so far): kill the leader of a partition, restart it later.
KILL_AT = (20_000, 60_000)
RESTART_AT = (40_000, 80_000)
FLUSH_TIMEOUT_S = 120.0
# What librdkafka says when an idempotent producer's guarantees break (error names and the
# words of its fatal-error and idempotence log lines).
BROKEN = re.compile(
    r"FATAL|fatal error|OUT_OF_ORDER_SEQUENCE|UNKNOWN_PRODUCER_ID|INVALID_PRODUCER_EPOCH"
    r"|PRODUCER_FENCED|_GAPLESS_GUARANTEE|_INCONSISTENT|sequence desynchroni[sz]ation",
    re.IGNORECASE,
)


@pytest.fixture(scope="module")
def three_nodes(cluster_dir: Path) -> Iterator[launcher.LocalCluster]:
    with running_cluster(cluster_dir) as cluster:
        yield cluster


def current(three: launcher.LocalCluster) -> launcher.LocalCluster:
    return three.current()


def kill_leader(three: launcher.LocalCluster, partition: int) -> int:
    cluster = current(three)
    node_id = asyncio.run(partition_leader(cluster.bootstrap, TOPIC, partition))
    node = next(n for n in cluster.nodes if n.node_id == node_id)
    launcher.kill(node.pid, signal.SIGKILL, wait_s=10)
    return node_id


class Reports:
    """Delivery reports and error callbacks, as librdkafka hands them to poll()."""

    def __init__(self) -> None:
        self.offsets: dict[int, list[tuple[int, int]]] = {p: [] for p in range(PARTITIONS)}
        self.failed: list[str] = []
        self.errors: list[KafkaError] = []

    def delivered(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.failed.append(f"{message.value()!r}: {error}")
            return
        index, partition, offset = (
            int(message.value() or b"-1"),
            message.partition(),
            message.offset(),
        )
        assert partition is not None and offset is not None, "a delivered record has both"
        self.offsets[partition].append((index, offset))

    def error(self, error: KafkaError) -> None:
        self.errors.append(error)


def produce_through_kills(three: launcher.LocalCluster, producer: CkProducer) -> list[int]:
    """Send every record at RATE_PER_S, killing and restarting leaders on the way; the nodes
    killed."""
    killed: list[int] = []
    start = time.monotonic()
    for i in range(RECORDS):
        if i in KILL_AT:
            killed.append(kill_leader(three, KILL_AT.index(i)))
        if i in RESTART_AT:
            launcher.restart_node(current(three), killed[RESTART_AT.index(i)])
        producer.produce(TOPIC, b"%06d" % i, partition=i % PARTITIONS)
        if i % 500 == 0:
            producer.poll(0)
            ahead_s = start + i / RATE_PER_S - time.monotonic()
            if ahead_s > 0:
                time.sleep(ahead_s)  # pacing, not synchronisation: keeps records in flight
    return killed


async def read_partition(cluster: launcher.LocalCluster, partition: int) -> list[tuple[int, int]]:
    """(record index, offset) of every record in the partition, in log order."""
    client = Client(cluster.bootstrap, request_timeout_s=10)
    consumer = Consumer(client, ConsumerConfig(max_wait_ms=100))
    read: list[tuple[int, int]] = []
    try:
        await consumer.assign(TOPIC, [partition], Consumer.EARLIEST)
        wanted = len(range(partition, RECORDS, PARTITIONS))

        async def all_read() -> bool:
            read.extend((int(r.value or b"-1"), r.offset) for r in await consumer.poll())
            return len(read) >= wanted and consumer.lag() == 0

        await apoll_until(all_read, 60, f"{TOPIC}-{partition} read back", interval_s=0)
    finally:
        await client.close()
    return read


def test_librdkafka_rides_out_two_leader_kills_exactly_once_in_order(
    three_nodes: launcher.LocalCluster, kafka_bootstrap: list[str], captured: Captured
) -> None:
    asyncio.run(_create(three_nodes))
    reports = Reports()
    producer = CkProducer(
        {
            "bootstrap.servers": ",".join(kafka_bootstrap),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": 60_000,
            "on_delivery": reports.delivered,
            "error_cb": reports.error,
            "logger": logging.getLogger("librdkafka"),
        }
    )
    killed = produce_through_kills(three_nodes, producer)
    assert producer.flush(FLUSH_TIMEOUT_S) == 0, "records not delivered in time"
    asyncio.run(launcher.wait_ready(current(three_nodes), 60))
    assert len(killed) == 2
    assert reports.failed == []
    assert [e for e in reports.errors if e.fatal() or BROKEN.search(str(e))] == []
    assert [line for line in captured.lines if BROKEN.search(line)] == []
    for partition in range(PARTITIONS):
        sent = list(range(partition, RECORDS, PARTITIONS))
        delivered = sorted(reports.offsets[partition], key=lambda pair: pair[1])
        assert [index for index, _ in delivered] == sent, f"partition {partition}: reports"
        logged = asyncio.run(read_partition(current(three_nodes), partition))
        assert logged == delivered, f"partition {partition}: the log"
        assert [offset for _, offset in logged] == list(range(len(sent)))
    starts = [asyncio.run(check_leader_epochs(kafka_bootstrap[0], p)) for p in range(PARTITIONS)]
    assert max(len(s) for s in starts) >= 2, f"no partition took records in two epochs: {starts}"


class Leader(NamedTuple):
    address: str  # its Kafka listener
    epoch: int
    follower: str  # a follower's Kafka listener


async def leader_of(bootstrap: str, partition: int) -> Leader | None:
    meta = await kafka_call(
        bootstrap, m.Api.METADATA, 9, m.MetadataRequest((m.MetadataRequestTopic(TOPIC),), False)
    )
    assert isinstance(meta, m.MetadataResponse)
    found = meta.topics[0].partitions[partition]
    addresses = {b.node_id: f"{b.host}:{b.port}" for b in meta.brokers}
    if found.leader_id not in addresses:
        return None
    follower = next(n for n in found.replica_nodes if n != found.leader_id)
    return Leader(addresses[found.leader_id], found.leader_epoch, addresses[follower])


async def epoch_starts(address: str, partition: int) -> tuple[list[tuple[int, int]], int]:
    """Each leader epoch's first offset, read from the batches a Fetch returns; the HW."""
    starts: list[tuple[int, int]] = []
    offset, high_watermark = 0, 1
    while offset < high_watermark:
        want = m.FetchPartition(partition, offset, 1 << 20)
        fetch = m.FetchRequest(0, 0, (m.FetchTopic(TOPIC, (want,)),))
        answer = await kafka_call(address, m.Api.FETCH, 12, fetch)
        assert isinstance(answer, m.FetchResponse)
        data = answer.responses[0].partitions[0]
        assert data.error_code == ErrorCode.NONE and data.records
        high_watermark, records = data.high_watermark, bytes(data.records)
        while len(records) >= 61:  # each whole batch: base offset, length, epoch, ...
            base, length, epoch = struct.unpack_from(">qii", records)
            (last_delta,) = struct.unpack_from(">i", records, 23)
            assert not starts or epoch >= starts[-1][0], "epochs never go back"
            if not starts or epoch > starts[-1][0]:
                starts.append((epoch, base))
            offset, records = base + last_delta + 1, records[12 + length :]
    return starts, high_watermark


def asked(partition: int, epoch: int, current: int = -1) -> m.OffsetForLeaderEpochRequest:
    wanted = m.OffsetForLeaderPartition(partition, epoch, current)
    return m.OffsetForLeaderEpochRequest((m.OffsetForLeaderTopic(TOPIC, (wanted,)),), -1)


async def epoch_end(address: str, request: m.OffsetForLeaderEpochRequest) -> m.EpochEndOffset:
    answer = await kafka_call(address, m.Api.OFFSET_FOR_LEADER_EPOCH, 4, request)
    assert isinstance(answer, m.OffsetForLeaderEpochResponse)
    return answer.topics[0].partitions[0]


async def check_leader_epochs(bootstrap: str, partition: int) -> list[tuple[int, int]]:
    """Every epoch of the partition's batches ends where the next begins (the last at the high
    watermark); a stale or future epoch of the leader is fenced; a follower does not answer."""

    async def settled() -> Leader | None:  # a leader whose epoch is what Metadata says
        leader = await leader_of(bootstrap, partition)
        if leader is None:
            return None
        answer = await epoch_end(leader.address, asked(partition, leader.epoch, leader.epoch))
        return leader if answer.error_code == ErrorCode.NONE else None

    leader = await apoll_until(settled, 30, f"a settled leader of partition {partition}")
    starts, high_watermark = await epoch_starts(leader.address, partition)
    assert starts and starts[-1][0] <= leader.epoch
    ends = [start for _, start in starts[1:]] + [high_watermark]
    for (epoch, _), end in zip(starts, ends, strict=True):
        answer = await epoch_end(leader.address, asked(partition, epoch, leader.epoch))
        assert (answer.error_code, answer.leader_epoch, answer.end_offset) == (0, epoch, end)
        between = await epoch_end(leader.address, asked(partition, epoch + 1))
        if all(e != epoch + 1 for e, _ in starts) and epoch + 1 < leader.epoch:
            assert (between.leader_epoch, between.end_offset) == (epoch, end), "a gap's epoch"
    for current, error in (
        (leader.epoch - 1, ErrorCode.FENCED_LEADER_EPOCH),
        (leader.epoch + 1, ErrorCode.UNKNOWN_LEADER_EPOCH),
    ):
        answer = await epoch_end(leader.address, asked(partition, starts[0][0], current))
        assert answer.error_code == error
    answer = await epoch_end(leader.follower, asked(partition, starts[0][0]))
    assert answer.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    await check_reads_by_epoch(leader, partition, starts, high_watermark)
    return starts


EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3  # ListOffsets' specs


async def check_reads_by_epoch(
    leader: Leader, partition: int, starts: list[tuple[int, int]], high_watermark: int
) -> None:
    """Fetch and ListOffsets check the reader's current leader epoch as OffsetForLeaderEpoch
    does, and ListOffsets answers the epoch of the record it found (the leader's for latest),
    as Kafka's broker does."""
    for current, error in (
        (leader.epoch - 1, ErrorCode.FENCED_LEADER_EPOCH),
        (leader.epoch + 1, ErrorCode.UNKNOWN_LEADER_EPOCH),
        (leader.epoch, ErrorCode.NONE),
        (-1, ErrorCode.NONE),
    ):
        want = m.FetchPartition(partition, 0, 1 << 10, current_leader_epoch=current)
        fetch = m.FetchRequest(0, 0, (m.FetchTopic(TOPIC, (want,)),))
        fetched = await kafka_call(leader.address, m.Api.FETCH, 12, fetch)
        assert isinstance(fetched, m.FetchResponse)
        data = fetched.responses[0].partitions[0]
        assert (data.error_code, bool(data.records)) == (error, error == ErrorCode.NONE)
        (found,) = await offsets(leader.address, partition, (EARLIEST,), current)
        assert found.error_code == error
    # earliest: the first epoch; a later epoch's first offset: that epoch; latest: the leader's
    specs = (EARLIEST, LATEST)
    earliest, latest = await offsets(leader.address, partition, specs, leader.epoch)
    assert (earliest.offset, earliest.leader_epoch) == (starts[0][1], starts[0][0])
    assert (latest.offset, latest.leader_epoch) == (high_watermark, leader.epoch)
    (top,) = await offsets(leader.address, partition, (MAX_TIMESTAMP,), leader.epoch)
    expected = max(e for e, start in starts if start <= top.offset)
    assert top.error_code == ErrorCode.NONE and top.leader_epoch == expected


async def offsets(
    address: str, partition: int, specs: tuple[int, ...], current: int
) -> tuple[m.ListOffsetsPartitionResponse, ...]:
    asked = tuple(m.ListOffsetsPartition(partition, spec, current) for spec in specs)
    request = m.ListOffsetsRequest((m.ListOffsetsTopic(TOPIC, asked),))
    answer = await kafka_call(address, m.Api.LIST_OFFSETS, 7, request)
    assert isinstance(answer, m.ListOffsetsResponse)
    return answer.topics[0].partitions


async def _create(cluster: launcher.LocalCluster) -> None:
    client = Client(cluster.bootstrap, request_timeout_s=10)
    try:
        await Admin(client).create_topic(TOPIC, PARTITIONS, 3)
        for partition in range(PARTITIONS):
            await partition_leader(cluster.bootstrap, TOPIC, partition)
    finally:
        await client.close()
