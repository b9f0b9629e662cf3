"""Kafka's own clients against the Kafka listener of a real 3-node cluster (one per module).

kcat lists brokers and topics; confluent-kafka's (librdkafka's) AdminClient, kafka-python's
KafkaAdminClient and aiokafka's AIOKafkaAdminClient list, create and delete topics. Each client's
debug log is read for the versions it negotiated, which are logged (`NEGOTIATED` lines, shown
with `-o log_cli=true`) and asserted, so a change to our version table that moves a client shows
here. Transactions: each client commits and aborts across partitions, read back by
read_committed and read_uncommitted consumers. Then, at the request level with our own codec as
the client: InitProducerId twice with one transactional id bumps the epoch (KIP-360's retry and
fencing too), FindCoordinator for transactions names the id's coordinator, ListOffsets,
DescribeProducers, DescribeCluster, and a Metadata that never creates a topic.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import subprocess
import time
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewTopic as AioNewTopic
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka import Producer as ConfluentProducer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from kafka import KafkaProducer as KafkaPythonProducer
from kafka.admin import KafkaAdminClient
from kafka.admin import NewTopic as KafkaPythonNewTopic

from cluster.client import Admin, Client, Producer
from cluster.kafka import messages as m
from cluster.local import launcher
from statemachine.errors import ErrorCode
from tests.kafka_wire import (
    Captured,
    kafka_call,
    kafka_calls,
    negotiated,
    report,
    served_init,
)
from tests.polling import apoll_until, poll_until

CLIENT_TIMEOUT_S = 30.0


def create_native(three_nodes: launcher.LocalCluster, topic: str, partitions: int) -> None:
    async def create() -> None:
        client = Client(three_nodes.bootstrap, request_timeout_s=10.0)
        try:
            await Admin(client).create_topic(topic, partitions, 3)
        finally:
            await client.close()

    asyncio.run(create())


# -- real clients ------------------------------------------------------------------------------


@pytest.mark.kcat
def test_kcat_lists_brokers_and_topics(
    three_nodes: launcher.LocalCluster, kafka_bootstrap: list[str]
) -> None:
    create_native(three_nodes, "kcat-listed", 3)
    done = subprocess.run(
        ["kcat", "-L", "-J", "-b", kafka_bootstrap[1], "-d", "protocol"],
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT_S,
        check=True,
    )
    listing = json.loads(done.stdout)
    brokers = {b["id"]: b["name"] for b in listing["brokers"]}
    assert brokers == {n.node_id: n.kafka_address for n in three_nodes.nodes}
    (topic,) = [t for t in listing["topics"] if t["topic"] == "kcat-listed"]
    assert [p["partition"] for p in topic["partitions"]] == [0, 1, 2]
    assert all(p["leader"] in brokers for p in topic["partitions"])
    versions = negotiated(done.stderr.splitlines(), r"Sent (\w+)Request \(v(\d+)")
    report("kcat (librdkafka 2.0.2)", versions)
    assert versions == {"ApiVersion": {3}, "Metadata": {4}}


def test_confluent_kafka_admin_lists_creates_and_deletes(
    three_nodes: launcher.LocalCluster, kafka_bootstrap: list[str], captured: Captured
) -> None:
    create_native(three_nodes, "ck-listed", 2)
    config: dict[str, Any] = {
        "bootstrap.servers": ",".join(kafka_bootstrap),
        "debug": "protocol",
        "logger": logging.getLogger("librdkafka"),  # its log, where `captured` reads it
    }
    admin = AdminClient(config)
    listed = admin.list_topics(timeout=CLIENT_TIMEOUT_S)
    assert "ck-listed" in listed.topics
    assert len(listed.topics["ck-listed"].partitions) == 2
    assert sorted(listed.brokers) == [1, 2, 3]
    (created,) = admin.create_topics([NewTopic("ck-made", 3, 3)]).values()
    created.result(CLIENT_TIMEOUT_S)
    (again,) = admin.create_topics([NewTopic("ck-made", 3, 3)]).values()
    with pytest.raises(Exception, match="TOPIC_ALREADY_EXISTS"):
        again.result(CLIENT_TIMEOUT_S)
    poll_until(
        lambda: _partitions(admin.list_topics(timeout=CLIENT_TIMEOUT_S), "ck-made") == 3,
        CLIENT_TIMEOUT_S,
        "ck-made listed with 3 partitions",
    )
    (deleted,) = admin.delete_topics(["ck-made"]).values()
    deleted.result(CLIENT_TIMEOUT_S)
    admin.poll(0)  # librdkafka's log reaches the logger when the client is polled
    versions = negotiated(captured.lines, r"Sent (\w+)Request \(v(\d+)")
    report("confluent-kafka 2.16 (librdkafka 2.16.0)", versions)
    assert versions == {
        "ApiVersion": {3},
        "Metadata": {13},
        "CreateTopics": {4},
        "DeleteTopics": {4},
    }


def test_kafka_python_admin_lists_and_creates(
    three_nodes: launcher.LocalCluster, kafka_bootstrap: list[str], captured: Captured
) -> None:
    create_native(three_nodes, "kp-listed", 1)
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, request_timeout_ms=10_000)
    try:
        assert "kp-listed" in admin.list_topics()
        admin.create_topics([KafkaPythonNewTopic("kp-made", 2, 3)])
        poll_until(lambda: "kp-made" in admin.list_topics(), CLIENT_TIMEOUT_S, "kp-made listed")
        cluster = admin.describe_cluster()
        assert sorted(b["broker_id"] for b in cluster["brokers"]) == [1, 2, 3]  # DescribeCluster
        admin.delete_topics(["kp-made"])
        poll_until(lambda: "kp-made" not in admin.list_topics(), CLIENT_TIMEOUT_S, "kp-made gone")
    finally:
        admin.close()
    versions = negotiated(captured.lines, r"Request \d+: (\w+)Request\(version=(\d+)")
    report("kafka-python 3.0", versions)
    # It asks ApiVersions v4 first, is answered in v0 with our versions (KIP-511), asks v3.
    assert versions["ApiVersions"] == {3, 4}
    assert versions["Metadata"] == {13}
    assert versions["CreateTopics"] == {7}
    assert versions["DeleteTopics"] == {6}
    assert versions["DescribeCluster"] == {2}


@pytest.mark.asyncio(loop_scope="function")
async def test_aiokafka_admin_lists_and_creates(
    three_nodes: launcher.LocalCluster, kafka_bootstrap: list[str], captured: Captured
) -> None:
    await asyncio.to_thread(create_native, three_nodes, "ak-listed", 1)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        assert "ak-listed" in await admin.list_topics()
        await admin.create_topics([AioNewTopic("ak-made", 2, 3)])

        async def listed() -> bool:  # another node may apply the creation a moment later
            return "ak-made" in await admin.list_topics()

        await apoll_until(listed, CLIENT_TIMEOUT_S, "ak-made listed")
        described = await admin.describe_cluster()
        assert sorted(b["node_id"] for b in described["brokers"]) == [1, 2, 3]
    finally:
        await admin.close()
    versions = negotiated(captured.lines, r"(\w+?)(?:Request|Response)_v(\d+)\(")
    report("aiokafka 0.14", versions)
    assert versions["ApiVersion"] == {0}
    assert versions["Metadata"] == {5}
    assert versions["CreateTopics"] == {3}


# -- at the request level ------------------------------------------------------------------------

TXN_TIMEOUT_MS = 60_000


def init(txn: str | None, pid: int = -1, epoch: int = -1) -> m.InitProducerIdRequest:
    return m.InitProducerIdRequest(txn, TXN_TIMEOUT_MS, pid, epoch)


def read_all(kafka_bootstrap: list[str], topics: dict[str, int], isolation: str) -> list[str]:
    """Every value of these topics' partitions, read from the start by a consumer of that
    isolation level until each partition's end."""
    consumer = ConfluentConsumer(
        {
            "bootstrap.servers": ",".join(kafka_bootstrap),
            "group.id": f"reader-{uuid.uuid4()}",
            "isolation.level": isolation,
            "enable.partition.eof": True,
        }
    )
    wanted = [TopicPartition(t, p, 0) for t, n in topics.items() for p in range(n)]
    consumer.assign(wanted)
    values: list[str] = []
    ended: set[tuple[str, int]] = set()
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    try:
        while len(ended) < len(wanted):
            assert time.monotonic() < deadline, f"read {len(values)} values, ended {ended}"
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                ended.add((str(message.topic()), int(message.partition() or 0)))
                continue
            values.append(bytes(message.value() or b"").decode())
    finally:
        consumer.close()
    return values


def test_transactions_commit_and_abort_atomically_across_clients(
    three_nodes: launcher.LocalCluster, kafka_bootstrap: list[str], captured: Captured
) -> None:
    """confluent-kafka, kafka-python and aiokafka each commit one transaction over three
    partitions of two topics and abort another after its data reached them: a read_committed
    reader sees every committed record and none of the aborted ones, a read_uncommitted reader
    both; a successor with the same transactional id fences the first instance (offsets in a
    transaction: test_kafka_exactly_once.py)."""
    topics = {"txn-orders": 2, "txn-audit": 1}
    for topic, partitions in topics.items():
        create_native(three_nodes, topic, partitions)
    config: dict[str, Any] = {
        "bootstrap.servers": ",".join(kafka_bootstrap),
        "transactional.id": "orders-txn",
        "debug": "protocol",
        "logger": logging.getLogger("librdkafka"),
    }
    producer = ConfluentProducer(config)
    producer.init_transactions(CLIENT_TIMEOUT_S)
    for tag, commit in (("ck-1", True), ("ck-abort", False), ("ck-2", True)):
        producer.begin_transaction()
        for i in range(4):
            producer.produce("txn-orders", f"{tag}-{i}".encode(), partition=i % 2)
            producer.produce("txn-audit", f"{tag}-audit-{i}".encode())
        producer.flush(CLIENT_TIMEOUT_S)  # the data is in the partitions before the outcome
        end = producer.commit_transaction if commit else producer.abort_transaction
        end(CLIENT_TIMEOUT_S)
    kafka_python_transactions(kafka_bootstrap)
    asyncio.run(aiokafka_transactions(kafka_bootstrap))
    committed = read_all(kafka_bootstrap, topics, "read_committed")
    everything = read_all(kafka_bootstrap, topics, "read_uncommitted")
    expected = {
        *(f"{tag}-{i}" for tag in ("ck-1", "ck-2") for i in range(4)),
        *(f"{tag}-audit-{i}" for tag in ("ck-1", "ck-2") for i in range(4)),
        "kp-commit",
        "aio-commit",
    }
    aborted = {*(f"ck-abort-{i}" for i in range(4)), "kp-abort", "aio-abort"}
    assert sorted(committed) == sorted(expected)  # each committed record once, no aborted one
    assert aborted <= set(everything)  # the aborted records are in the log, hidden
    successor = ConfluentProducer(config)
    successor.init_transactions(CLIENT_TIMEOUT_S)
    producer.begin_transaction()
    producer.produce("txn-orders", b"zombie", partition=0)
    with pytest.raises(KafkaException) as fenced:
        producer.commit_transaction(CLIENT_TIMEOUT_S)
    assert fenced.value.args[0].fatal(), fenced.value.args[0]
    assert "zombie" not in read_all(kafka_bootstrap, topics, "read_committed")
    for client, pattern in (
        ("confluent-kafka 2.16", r"Sent (\w+)Request \(v(\d+)"),
        ("kafka-python 3.0", r"Request \d+: (\w+)Request\(version=(\d+)"),
        ("aiokafka 0.14", r"(\w+?)(?:Request|Response)_v(\d+)\("),
    ):
        versions = negotiated(captured.lines, pattern)
        report(client, {k: v for k, v in versions.items() if "Txn" in k})
    assert negotiated(captured.lines, r"Sent (EndTxn)Request \(v(\d+)") == {"EndTxn": {1}}


def kafka_python_transactions(kafka_bootstrap: list[str]) -> None:
    producer = KafkaPythonProducer(
        bootstrap_servers=kafka_bootstrap, transactional_id="kp-txn", enable_idempotence=True
    )
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("txn-orders", b"kp-commit", partition=1)
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send("txn-audit", b"kp-abort")
        producer.flush()
        producer.abort_transaction()
    finally:
        producer.close(timeout=1)


async def aiokafka_transactions(kafka_bootstrap: list[str]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id="aio-txn")
    await producer.start()
    try:
        async with producer.transaction():
            await producer.send_and_wait("txn-audit", b"aio-commit")
        await producer.begin_transaction()
        await producer.send_and_wait("txn-orders", b"aio-abort", partition=0)
        await producer.abort_transaction()
    finally:
        await producer.stop()


@pytest.mark.asyncio(loop_scope="function")
async def test_init_producer_id_twice_bumps_the_epoch(kafka_bootstrap: list[str]) -> None:
    txn = f"txn-{uuid.uuid4()}"
    api = m.Api.INIT_PRODUCER_ID
    first = await served_init(kafka_bootstrap[0], 0, init(txn))
    second = await served_init(kafka_bootstrap[2], 1, init(txn))  # another node, older version
    assert isinstance(first, m.InitProducerIdResponse)
    assert isinstance(second, m.InitProducerIdResponse)
    assert first.error_code == second.error_code == ErrorCode.NONE
    assert second.producer_id == first.producer_id
    assert second.producer_epoch == first.producer_epoch + 1
    pid, epoch = second.producer_id, second.producer_epoch
    # KIP-360: the current pair bumps again; the previous pair is a retry of the call that
    # succeeded (the current pair back); an older one is fenced, as each version says it.
    bumped, retried, fenced_v4, fenced_v3 = await kafka_calls(
        kafka_bootstrap[1],
        [
            (api, 4, init(txn, pid, epoch)),
            (api, 4, init(txn, pid, epoch)),
            (api, 4, init(txn, pid, epoch - 1)),
            (api, 3, init(txn, pid, epoch - 1)),
        ],
    )
    assert bumped == m.InitProducerIdResponse(ErrorCode.NONE, pid, epoch + 1)
    assert retried == m.InitProducerIdResponse(ErrorCode.NONE, pid, epoch + 1)
    assert isinstance(fenced_v4, m.InitProducerIdResponse)
    assert isinstance(fenced_v3, m.InitProducerIdResponse)
    assert fenced_v4.error_code == ErrorCode.PRODUCER_FENCED
    assert fenced_v3.error_code == ErrorCode.INVALID_PRODUCER_EPOCH  # before v4 there was none


@pytest.mark.asyncio(loop_scope="function")
async def test_init_producer_id_without_transactional_id_gives_a_new_producer(
    kafka_bootstrap: list[str],
) -> None:
    api = m.Api.INIT_PRODUCER_ID
    first, second, with_pair = await kafka_calls(
        kafka_bootstrap[0], [(api, 0, init(None)), (api, 5, init(None)), (api, 5, init(None, 9, 0))]
    )
    answers = [first, second, with_pair]
    assert all(isinstance(a, m.InitProducerIdResponse) for a in answers)
    pids = [a.producer_id for a in answers if isinstance(a, m.InitProducerIdResponse)]
    assert len(set(pids)) == 3, "each call a new producer id, as Kafka gives"
    assert all(a.producer_epoch == 0 and a.error_code == 0 for a in answers)  # type: ignore[attr-defined]
    invalid = await kafka_call(kafka_bootstrap[0], api, 5, init(""))
    assert invalid == m.InitProducerIdResponse(ErrorCode.INVALID_REQUEST)


@pytest.mark.asyncio(loop_scope="function")
async def test_find_coordinator_for_transactions_names_the_ids_coordinator(
    three_nodes: launcher.LocalCluster, kafka_bootstrap: list[str]
) -> None:
    """Every node names the same coordinator for a transactional id: the leader of its
    transaction state partition, once the topic (created on the first ask) has leaders."""
    api = m.Api.FIND_COORDINATOR
    nodes = {n.node_id: n for n in three_nodes.nodes}

    async def found(address: str) -> tuple[int, int] | None:
        answer = await kafka_call(address, api, 1, m.FindCoordinatorRequest("txn-a", 1))
        assert isinstance(answer, m.FindCoordinatorResponse)
        if answer.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE:
            return None
        assert answer.error_code == ErrorCode.NONE, answer
        return answer.node_id, answer.port

    answers = []
    for node in three_nodes.nodes:

        async def asked(address: str = node.kafka_address) -> tuple[int, int] | None:
            return await found(address)

        answers.append(await apoll_until(asked, CLIENT_TIMEOUT_S, "a coordinator"))
    node_id, port = answers[0]
    assert node_id in nodes and port == nodes[node_id].kafka_port
    assert answers == [answers[0]] * 3
    batched = await kafka_call(
        kafka_bootstrap[1], api, 4, m.FindCoordinatorRequest("", 1, ("txn-a", ""))
    )
    assert isinstance(batched, m.FindCoordinatorResponse)
    assert [(c.key, c.node_id, c.error_code) for c in batched.coordinators] == [
        ("txn-a", node_id, 0),
        ("", -1, ErrorCode.INVALID_REQUEST),
    ]


@pytest.mark.asyncio(loop_scope="function")
async def test_list_offsets_and_describe_producers(
    three_nodes: launcher.LocalCluster, kafka_bootstrap: list[str]
) -> None:
    topic = "offsets-listed"
    client = Client(three_nodes.bootstrap, request_timeout_s=10.0)
    try:
        await Admin(client).create_topic(topic, 1, 3)
        async with Producer(client) as producer:
            acks = [await producer.send(topic, b"v%d" % i, partition=0) for i in range(10)]
            offsets = [(await ack).offset for ack in acks]
    finally:
        await client.close()
    assert offsets == list(range(10))
    queries = m.ListOffsetsRequest(
        (
            m.ListOffsetsTopic(
                topic,
                (
                    m.ListOffsetsPartition(0, -2),  # earliest
                    m.ListOffsetsPartition(0, -1),  # latest
                    m.ListOffsetsPartition(0, 0),  # the first batch appended at time 0 or later
                    m.ListOffsetsPartition(0, 2**62),  # later than any: the high watermark
                    m.ListOffsetsPartition(0, -3),  # max timestamp: from v7 only (this is v6)
                    m.ListOffsetsPartition(7, -1),
                ),
            ),
            m.ListOffsetsTopic("no-such-topic", (m.ListOffsetsPartition(0, -1),)),
        )
    )
    answers = []
    for address in kafka_bootstrap:  # only the leader answers; the others say who it is not
        (answer,) = await kafka_calls(address, [(m.Api.LIST_OFFSETS, 6, queries)])
        assert isinstance(answer, m.ListOffsetsResponse)
        answers.append(answer)
    (led,) = [a for a in answers if a.topics[0].partitions[0].error_code == ErrorCode.NONE]
    found = [(p.error_code, p.offset) for p in led.topics[0].partitions]
    assert found == [
        (0, 0),
        (0, 10),
        (0, 0),
        (0, 10),
        (ErrorCode.UNSUPPORTED_VERSION, -1),
        (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1),
    ]
    assert led.topics[1].partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    leader = kafka_bootstrap[answers.index(led)]
    described = await kafka_call(
        leader,
        m.Api.DESCRIBE_PRODUCERS,
        0,
        m.DescribeProducersRequest((m.TopicRequest(topic, (0,)),)),
    )
    assert isinstance(described, m.DescribeProducersResponse)
    (partition,) = described.topics[0].partitions
    (state,) = partition.active_producers
    assert (partition.error_code, state.producer_epoch, state.last_sequence) == (0, 0, 9)


@pytest.mark.asyncio(loop_scope="function")
async def test_metadata_never_creates_a_topic_and_describe_cluster(
    three_nodes: launcher.LocalCluster, kafka_bootstrap: list[str]
) -> None:
    asked = m.MetadataRequest(
        (m.MetadataRequestTopic("never-made"),), allow_auto_topic_creation=True
    )
    for version in (1, 4, 9, 12):
        answer = await kafka_call(kafka_bootstrap[0], m.Api.METADATA, version, asked)
        assert isinstance(answer, m.MetadataResponse)
        (topic,) = answer.topics
        assert topic.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert [b.node_id for b in answer.brokers] == [1, 2, 3]
    by_id = m.MetadataRequest((m.MetadataRequestTopic(None, uuid.uuid4()),))
    answer = await kafka_call(kafka_bootstrap[0], m.Api.METADATA, 12, by_id)
    assert isinstance(answer, m.MetadataResponse)
    assert answer.topics[0].error_code == ErrorCode.UNKNOWN_TOPIC_ID
    cluster = await kafka_call(
        kafka_bootstrap[2], m.Api.DESCRIBE_CLUSTER, 0, m.DescribeClusterRequest()
    )
    assert isinstance(cluster, m.DescribeClusterResponse)
    assert cluster.cluster_id == "raftbroker"
    assert [(b.broker_id, b.host, b.port) for b in cluster.brokers] == [
        (n.node_id, n.host, n.kafka_port) for n in three_nodes.nodes
    ]
    assert cluster.controller_id in (1, 2, 3)


def _partitions(listed: Any, topic: str) -> int:
    """How many partitions a listing shows for `topic` (0 while the node asked does not know
    it yet: a topic just created reaches each node's metadata when that node applies it)."""
    found = listed.topics.get(topic)
    return 0 if found is None else len(found.partitions)


@pytest.mark.asyncio(loop_scope="function")
async def test_describe_and_list_transactions(
    three_nodes: launcher.LocalCluster, kafka_bootstrap: list[str]
) -> None:
    """KIP-664 at the request level: the coordinator describes an open transaction with its
    partitions; every node lists the ids it coordinates, so the union over the nodes holds
    each once; an unknown state filter is named back; after EndTxn the abort completes."""
    await asyncio.to_thread(create_native, three_nodes, "txn-described", 2)
    txn = f"admin-{uuid.uuid4()}"
    producer = await served_init(kafka_bootstrap[0], 4, init(txn))
    pid, epoch = producer.producer_id, producer.producer_epoch
    find = await kafka_call(
        kafka_bootstrap[0], m.Api.FIND_COORDINATOR, 1, m.FindCoordinatorRequest(txn, 1)
    )
    assert isinstance(find, m.FindCoordinatorResponse)
    coordinator = f"{find.host}:{find.port}"
    topics = (m.AddPartitionsToTxnTopic("txn-described", (1, 0)),)
    added = await kafka_call(
        coordinator,
        m.Api.ADD_PARTITIONS_TO_TXN,
        3,
        m.AddPartitionsToTxnRequest(txn, pid, epoch, topics),
    )
    assert isinstance(added, m.AddPartitionsToTxnResponse)
    errors = [
        r.partition_error_code
        for t in added.results_by_topic_v3_and_below
        for r in t.results_by_partition
    ]
    assert errors == [0, 0]
    # An id no producer used, coordinated by the same node (the others answer NOT_COORDINATOR).
    for n in itertools.count():
        stranger = f"no-such-id-{n}"
        asked = m.FindCoordinatorRequest(stranger, 1)
        found = await kafka_call(kafka_bootstrap[0], m.Api.FIND_COORDINATOR, 1, asked)
        assert isinstance(found, m.FindCoordinatorResponse)
        if found.node_id == find.node_id:
            break
    described = await kafka_call(
        coordinator, m.Api.DESCRIBE_TRANSACTIONS, 0, m.DescribeTransactionsRequest((txn, stranger))
    )
    assert isinstance(described, m.DescribeTransactionsResponse)
    (mine, unknown) = described.transaction_states
    assert (mine.error_code, mine.transaction_state, mine.producer_id, mine.producer_epoch) == (
        0, "Ongoing", pid, epoch,
    )  # fmt: skip
    assert mine.topics == (m.TopicData("txn-described", (0, 1)),)
    assert mine.transaction_start_time > 0
    assert unknown.error_code == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
    listed: list[str] = []
    for node in three_nodes.nodes:
        answer = await kafka_call(
            node.kafka_address,
            m.Api.LIST_TRANSACTIONS,
            1,
            m.ListTransactionsRequest(("Ongoing",), (pid,)),
        )
        assert isinstance(answer, m.ListTransactionsResponse)
        listed += [
            t.transactional_id
            for t in answer.transaction_states
            if t.transaction_state == "Ongoing"
        ]
    assert listed == [txn]
    nope = await kafka_call(
        kafka_bootstrap[1], m.Api.LIST_TRANSACTIONS, 0, m.ListTransactionsRequest(("Nope",))
    )
    assert nope == m.ListTransactionsResponse(0, ("Nope",), ())
    ended = await kafka_call(coordinator, m.Api.END_TXN, 3, m.EndTxnRequest(txn, pid, epoch, False))
    assert ended == m.EndTxnResponse(ErrorCode.NONE)

    async def completed() -> bool:
        answer = await kafka_call(
            coordinator, m.Api.DESCRIBE_TRANSACTIONS, 0, m.DescribeTransactionsRequest((txn,))
        )
        assert isinstance(answer, m.DescribeTransactionsResponse)
        return answer.transaction_states[0].transaction_state == "CompleteAbort"

    await apoll_until(completed, CLIENT_TIMEOUT_S, "the abort's markers written")
