"""Exactly-once consume-transform-produce through Kafka's clients on a real 3-node cluster.

A confluent-kafka (librdkafka) processor reads an input topic in a consumer group, writes each
record transformed to an output topic and commits its input offsets in the same transaction
(`send_offsets_to_transaction`: AddOffsetsToTxn, then TxnOffsetCommit to the group's
coordinator). Its first transaction is aborted, as a crash would leave it; a second instance
with the same transactional id and group carries on from the committed offsets. A
read_committed reader of the output then sees each input exactly once, and the group's
committed offsets are the input's ends. While a transaction's offsets are pending, OffsetFetch
with RequireStable answers UNSTABLE_OFFSET_COMMIT and without it the last committed offset.
kafka-python's and aiokafka's transactional producers commit and abort offsets the same way,
and kcat (`-X transactional.id`) writes its input as one transaction.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import time
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer, KafkaError, Message, Producer
from kafka import KafkaProducer as KafkaPythonProducer
from kafka.structs import OffsetAndMetadata
from kafka.structs import TopicPartition as KpTopicPartition

from cluster.kafka import messages as m
from cluster.local import launcher
from statemachine.errors import ErrorCode
from tests.cluster.test_kafka_admin import committed, coordinator
from tests.cluster.test_kafka_clients import create_native, read_all
from tests.kafka_wire import Captured, kafka_call, negotiated, report

TIMEOUT_S = 30.0
IN, OUT = "eos-in", "eos-out"
IN_PARTITIONS = 2
RECORDS = 60
BATCH = 10
REQUIRE_STABLE_SINCE_VERSION = 7  # OffsetFetch


@pytest.fixture(scope="module")
def inputs(three_nodes: launcher.LocalCluster, kafka_bootstrap: list[str]) -> list[str]:
    create_native(three_nodes, IN, IN_PARTITIONS)
    create_native(three_nodes, OUT, 1)
    producer = Producer({"bootstrap.servers": ",".join(kafka_bootstrap)})
    values = [f"in-{i}" for i in range(RECORDS)]
    for i, value in enumerate(values):
        producer.produce(IN, value.encode(), partition=i % IN_PARTITIONS)
    assert producer.flush(TIMEOUT_S) == 0
    return values


class Processor:
    """One instance of a consume-transform-produce application (librdkafka's pattern)."""

    def __init__(self, bootstrap: str, group: str, txn_id: str) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
            }
        )
        self.consumer.subscribe([IN])
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "transactional.id": txn_id,
                "debug": "protocol",
                "logger": logging.getLogger("librdkafka"),
            }
        )
        self.producer.init_transactions(TIMEOUT_S)
        self.ended: set[int] = set()

    def batch(self) -> list[Message]:
        """Up to BATCH input records (the partitions' ends are noted as they come)."""
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            assert time.monotonic() < deadline, "no input read"
            messages = self.consumer.consume(BATCH, 0.5)
            data = []
            for message in messages:
                error = message.error()
                if error is None:
                    data.append(message)
                else:
                    assert error.code() == KafkaError._PARTITION_EOF, error
                    self.ended.add(int(message.partition() or 0))
            if data or self.done:
                return data

    @property
    def done(self) -> bool:
        return len(self.ended) == IN_PARTITIONS

    def transform(self, records: list[Message]) -> None:
        """Begin; the outputs and the input offsets go into the transaction."""
        self.producer.begin_transaction()
        for record in records:
            self.producer.produce(OUT, b"out-" + bytes(record.value() or b""))
        positions = self.consumer.position(self.consumer.assignment())
        self.producer.send_offsets_to_transaction(
            positions, self.consumer.consumer_group_metadata(), TIMEOUT_S
        )

    def close(self) -> None:
        self.consumer.close()


def offset_fetch(bootstrap: str, group: str, partition: int, *, stable: bool) -> tuple[int, int]:
    """(error code, committed offset) of one input partition, from the group's coordinator."""
    request = m.OffsetFetchRequest(
        group, (m.OffsetFetchRequestTopic(IN, (partition,)),), require_stable=stable
    )
    answer = asyncio.run(
        kafka_call(
            coordinator(bootstrap, group),
            m.Api.OFFSET_FETCH,
            REQUIRE_STABLE_SINCE_VERSION,
            request,
        )
    )
    assert isinstance(answer, m.OffsetFetchResponse) and answer.error_code == 0, answer
    fetched = answer.topics[0].partitions[0]
    return fetched.error_code, fetched.committed_offset


def test_consume_transform_produce_is_exactly_once(
    kafka_bootstrap: list[str], inputs: list[str], captured: Captured
) -> None:
    bootstrap = ",".join(kafka_bootstrap)
    group, txn_id = "eos-group", "eos-processor"
    first = Processor(bootstrap, group, txn_id)
    first.transform(first.batch())
    first.producer.abort_transaction(TIMEOUT_S)  # as a crash before the commit leaves it
    first.close()
    assert committed(bootstrap, group, IN, IN_PARTITIONS) == [-1001] * IN_PARTITIONS
    second = Processor(bootstrap, group, txn_id)
    checked_pending = False
    while not second.done:
        records = second.batch()
        if not records:
            continue
        second.transform(records)
        if not checked_pending:
            partition = int(records[0].partition() or 0)
            before = offset_fetch(bootstrap, group, partition, stable=False)
            assert before == (ErrorCode.NONE, -1)  # the last committed: none yet
            pending = offset_fetch(bootstrap, group, partition, stable=True)
            assert pending[0] == ErrorCode.UNSTABLE_OFFSET_COMMIT
            checked_pending = True
        second.producer.commit_transaction(TIMEOUT_S)
    second.close()
    outputs = read_all(kafka_bootstrap, {OUT: 1}, "read_committed")
    assert sorted(outputs) == sorted(f"out-{v}" for v in inputs)  # each input exactly once
    assert len(read_all(kafka_bootstrap, {OUT: 1}, "read_uncommitted")) > len(outputs)
    per_partition = RECORDS // IN_PARTITIONS
    assert committed(bootstrap, group, IN, IN_PARTITIONS) == [per_partition] * IN_PARTITIONS
    report("confluent-kafka", _txn_versions(captured, r"Sent (\w+)Request \(v(\d+)"))


def _txn_versions(captured: Captured, pattern: str) -> dict[str, set[int]]:
    versions = negotiated(captured.lines, pattern)
    return {k: v for k, v in versions.items() if "Txn" in k}


@pytest.fixture
def group_id() -> str:
    return f"eos-{uuid.uuid4().hex[:8]}"


def test_kafka_python_commits_and_aborts_offsets_in_transactions(
    kafka_bootstrap: list[str], inputs: list[str], group_id: str, captured: Captured
) -> None:
    producer = KafkaPythonProducer(
        bootstrap_servers=kafka_bootstrap, transactional_id=f"kp-{group_id}"
    )
    try:
        producer.init_transactions()
        for offset, commit in ((5, True), (9, False)):
            producer.begin_transaction()
            producer.send(OUT, b"kp-eos")
            producer.send_offsets_to_transaction(
                {KpTopicPartition(IN, 0): OffsetAndMetadata(offset, "", -1)}, group_id
            )
            (producer.commit_transaction if commit else producer.abort_transaction)()
    finally:
        producer.close(timeout=1)
    assert committed(",".join(kafka_bootstrap), group_id, IN, 1) == [5]
    report("kafka-python", _txn_versions(captured, r"Request \d+: (\w+)Request\(version=(\d+)"))


def test_aiokafka_commits_and_aborts_offsets_in_transactions(
    kafka_bootstrap: list[str], inputs: list[str], group_id: str, captured: Captured
) -> None:
    async def run() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka_bootstrap, transactional_id=f"aio-{group_id}"
        )
        await producer.start()
        try:
            for offset, commit in ((7, True), (11, False)):
                await producer.begin_transaction()
                await producer.send_and_wait(OUT, b"aio-eos")
                offsets: dict[Any, int] = {AioTopicPartition(IN, 1): offset}
                await producer.send_offsets_to_transaction(offsets, group_id)
                if commit:
                    await producer.commit_transaction()
                else:
                    await producer.abort_transaction()
        finally:
            await producer.stop()

    asyncio.run(run())
    assert committed(",".join(kafka_bootstrap), group_id, IN, IN_PARTITIONS) == [-1001, 7]
    report("aiokafka", _txn_versions(captured, r"(\w+?)(?:Request|Response)_v(\d+)\("))


@pytest.mark.kcat
def test_kcat_writes_its_input_as_one_transaction(
    three_nodes: launcher.LocalCluster, kafka_bootstrap: list[str]
) -> None:
    """kcat -P -X transactional.id=...: its whole input in one transaction, committed at the
    end (librdkafka's transactional producer, in C), read back by a read_committed reader."""
    create_native(three_nodes, "kcat-txn", 2)
    lines = "".join(f"kcat-{i}\n" for i in range(50))
    done = subprocess.run(
        ["kcat", "-P", "-t", "kcat-txn", "-b", ",".join(kafka_bootstrap),
         "-X", "transactional.id=kcat-txn", "-d", "protocol"],
        input=lines, capture_output=True, text=True, timeout=TIMEOUT_S, check=True,
    )  # fmt: skip
    sent = negotiated(done.stderr.splitlines(), r"Sent (\w+)Request \(v(\d+)")
    report("kcat (librdkafka 2.0.2), transactional", {k: v for k, v in sent.items() if "Txn" in k})
    assert {"InitProducerId", "AddPartitionsToTxn", "EndTxn"} <= set(sent), sent
    read = read_all(kafka_bootstrap, {"kcat-txn": 2}, "read_committed")
    assert sorted(read) == sorted(lines.split()), read
