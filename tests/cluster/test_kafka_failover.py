"""librdkafka rides out leader kills through the Kafka listener, exactly once, in order.

confluent-kafka, idempotent, acks=all: 100,000 records over 3 partitions, paced so that they are
in flight for several seconds; meanwhile the leader of a partition is SIGKILLed and later
restarted, twice. librdkafka is the strict oracle: it raises fatal errors on idempotence
violations (a sequence gap, an epoch it did not expect), so besides its delivery reports the
test reads its error callbacks and its log lines. Every delivery report must be a success, no
fatal or idempotence error may be reported or logged, and each partition must hold each of its
records exactly once, in the order the producer sent them, at the offsets reported.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message
from confluent_kafka import Producer as CkProducer

from cluster.client import Admin, Client, Consumer, ConsumerConfig
from cluster.local import launcher
from tests.cluster.conftest import running_cluster
from tests.cluster.procs import partition_leader
from tests.kafka_wire import Captured
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


async def _create(cluster: launcher.LocalCluster) -> None:
    client = Client(cluster.bootstrap, request_timeout_s=10)
    try:
        await Admin(client).create_topic(TOPIC, PARTITIONS, 3)
        for partition in range(PARTITIONS):
            await partition_leader(cluster.bootstrap, TOPIC, partition)
    finally:
        await client.close()
