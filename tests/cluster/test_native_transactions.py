"""Transactions through the native protocol, on a real 3-node cluster: the client library's
`TransactionalProducer` and read_committed `Consumer`, and Kafka's clients reading what it
wrote (and it reading what they wrote), since both protocols share one coordinator and one log.

- A transaction over several partitions is read by a read_committed consumer all at once, after
  its commit, and never when aborted; a read_uncommitted one reads both. While a transaction is
  open, a read_committed consumer stops at its first offset (the last stable offset) even past
  records committed after it, and goes on once it commits.
- A second producer with the same transactional id fences the first: the first's commit is
  PRODUCER_FENCED, and the transaction it left open is aborted.
- Consume-transform-produce with a `GroupConsumer` and `send_offsets`: an aborted transaction
  leaves the group's offsets as they were, a committed one moves them; while its offsets are
  pending, OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT.
- confluent-kafka's read_committed consumer reads a native transaction exactly as committed,
  and the native read_committed consumer drops a confluent-kafka transaction that aborted.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer as KafkaProducer

from cluster import native as p
from cluster.client import (
    Admin,
    Client,
    ClientError,
    ConsumedRecord,
    Consumer,
    ConsumerConfig,
    GroupConfig,
    GroupConsumer,
    Groups,
    ProducerFencedError,
    TransactionalProducer,
)
from cluster.local import launcher
from statemachine.errors import ErrorCode
from tests.cluster.test_cli import ok as cli_ok
from tests.cluster.test_cli import raftbroker
from tests.polling import apoll_until

pytestmark = pytest.mark.asyncio(loop_scope="function")
TIMEOUT_S = 30.0
PARTITIONS = 3


async def new_topic(client: Client, partitions: int = PARTITIONS) -> str:
    topic = f"ntxn-{uuid.uuid4().hex[:8]}"
    await Admin(client).create_topic(topic, partitions, 3)
    return topic


async def read_values(client: Client, topic: str, *, read_committed: bool = True,
                      until: int = 0) -> list[str]:  # fmt: skip
    """Every value a consumer reads from the start of `topic`: at least `until` values (a
    commit's markers follow its answer: its records become readable a moment later), then
    on to what is there to read (the last stable offset, for a read_committed one)."""
    consumer = Consumer(client, ConsumerConfig(read_committed=read_committed))
    await consumer.assign(topic)
    records: list[ConsumedRecord] = []

    async def enough() -> bool:
        records.extend(await consumer.poll(100))
        return len(records) >= until

    await apoll_until(enough, TIMEOUT_S, f"{until} values of {topic}")
    admin = Admin(client)
    ends = {
        key: await admin.list_offsets(*key, Consumer.LATEST, read_committed=read_committed)
        for key in consumer.positions
    }

    async def at_ends() -> bool:
        if all(consumer.positions[k].offset >= end for k, end in ends.items()):
            return True
        records.extend(await consumer.poll(100))
        return False

    await apoll_until(at_ends, TIMEOUT_S, f"reading {topic} to its end")
    return [(r.value or b"").decode() for r in records]


async def send_all(producer: TransactionalProducer, topic: str, values: list[str]) -> None:
    for i, value in enumerate(values):
        await producer.send(topic, value.encode(), partition=i % PARTITIONS)


async def test_commit_is_read_at_once_and_abort_never(client: Client) -> None:
    topic = await new_topic(client)
    async with TransactionalProducer(client, f"t-{uuid.uuid4().hex[:8]}") as producer:
        producer.begin()
        await send_all(producer, topic, ["a0", "a1", "a2"])
        await producer.abort()
        producer.begin()
        await send_all(producer, topic, ["c0", "c1", "c2", "c3"])
        await producer.commit()
    committed = await read_values(client, topic, until=4)
    assert sorted(committed) == ["c0", "c1", "c2", "c3"]
    everything = await read_values(client, topic, read_committed=False, until=7)
    assert sorted(everything) == ["a0", "a1", "a2", "c0", "c1", "c2", "c3"]


async def test_an_open_transaction_holds_read_committed_readers_at_its_start(
    client: Client,
) -> None:
    topic = await new_topic(client, 1)
    txn_id = f"t-{uuid.uuid4().hex[:8]}"
    async with (
        TransactionalProducer(client, txn_id) as open_one,
        TransactionalProducer(client, f"{txn_id}-b") as other,
    ):
        open_one.begin()
        await (await open_one.send(topic, b"held", partition=0))
        other.begin()
        await (await other.send(topic, b"later", partition=0))
        await other.commit()
        admin = Admin(client)
        stable = await admin.list_offsets(topic, 0, Consumer.LATEST, read_committed=True)
        high = await admin.list_offsets(topic, 0, Consumer.LATEST)
        # "later" (and its marker, once written: EndTxn does not wait for it) lie past it.
        assert stable == 0 and high >= 2
        consumer = Consumer(client, ConsumerConfig(read_committed=True))
        await consumer.assign(topic)
        assert await consumer.poll(200) == []
        await open_one.commit()
        got = await read_values(client, topic, until=2)
        assert got == ["held", "later"]


async def test_a_new_instance_fences_the_old_and_aborts_what_it_left_open(client: Client) -> None:
    topic = await new_topic(client)
    txn_id = f"t-{uuid.uuid4().hex[:8]}"
    async with TransactionalProducer(client, txn_id) as zombie:
        zombie.begin()
        await send_all(zombie, topic, ["z0", "z1"])
        async with TransactionalProducer(client, txn_id) as successor:
            with pytest.raises(ProducerFencedError):
                await zombie.commit()
            successor.begin()
            await send_all(successor, topic, ["s0"])
            await successor.commit()
    assert await read_values(client, topic, until=1) == ["s0"]


async def test_consume_transform_produce_with_offsets_in_the_transaction(client: Client) -> None:
    source, sink = await new_topic(client), await new_topic(client)
    group = f"g-{uuid.uuid4().hex[:8]}"
    async with TransactionalProducer(client, f"in-{group}") as loader:
        loader.begin()
        await send_all(loader, source, [f"v{i}" for i in range(6)])
        await loader.commit()
    member_config = GroupConfig(
        session_timeout_ms=6_000, heartbeat_interval_ms=500, auto_offset_reset=Consumer.EARLIEST
    )
    member = GroupConsumer(client, group, [source], member_config)
    try:
        records: list[ConsumedRecord] = []
        await apoll_until(lambda: _polled(member, records, 6), TIMEOUT_S, "the group's records")
        nexts = {(r.topic, r.partition): r.offset + 1 for r in records}
        async with TransactionalProducer(client, f"ctp-{group}") as producer:
            for attempt in ("abort", "commit"):
                producer.begin()
                for r in records:
                    await producer.send(sink, (r.value or b"").upper(), partition=r.partition)
                await producer.send_offsets(nexts, member.group_metadata())
                fetch = p.OffsetFetch(group, tuple(p.GroupPartition(*k) for k in nexts), True)
                answer = await client.call_coordinator(group, fetch)
                assert isinstance(answer, p.OffsetFetchResponse)
                assert {o.error for o in answer.offsets} == {ErrorCode.UNSTABLE_OFFSET_COMMIT}
                if attempt == "abort":
                    await producer.abort()
                    assert await Groups(client).committed(group, nexts, require_stable=True) == {}
                else:
                    await producer.commit()
                    assert (
                        await Groups(client).committed(group, nexts, require_stable=True) == nexts
                    )
    finally:
        await member.close()
    assert sorted(await read_values(client, sink, until=6)) == [f"V{i}" for i in range(6)]


async def _polled(member: GroupConsumer, records: list[ConsumedRecord], count: int) -> bool:
    records.extend(await member.poll(100))
    return len(records) >= count


async def test_kafka_clients_and_native_ones_read_each_others_transactions(
    client: Client, kafka_bootstrap: list[str]
) -> None:
    topic = await new_topic(client, 1)
    async with TransactionalProducer(client, f"t-{uuid.uuid4().hex[:8]}") as producer:
        producer.begin()
        await producer.send(topic, b"native-aborted", partition=0)
        await producer.abort()
        producer.begin()
        await producer.send(topic, b"native-committed", partition=0)
        await producer.commit()
    bootstrap = ",".join(kafka_bootstrap)
    kafka = KafkaProducer({"bootstrap.servers": bootstrap, "transactional.id": f"k-{topic}"})
    await asyncio.to_thread(kafka.init_transactions, TIMEOUT_S)
    for value, commit in ((b"kafka-aborted", False), (b"kafka-committed", True)):
        kafka.begin_transaction()
        kafka.produce(topic, value, partition=0)
        end = kafka.commit_transaction if commit else kafka.abort_transaction
        await asyncio.to_thread(end, TIMEOUT_S)
    assert await read_values(client, topic, until=2) == ["native-committed", "kafka-committed"]
    assert await asyncio.to_thread(kafka_read_committed, bootstrap, topic, 2) == [
        "native-committed",
        "kafka-committed",
    ]


def kafka_read_committed(bootstrap: str, topic: str, count: int) -> list[str]:
    consumer = KafkaConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"rc-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe([topic])
        values: list[str] = []
        end = time.monotonic() + TIMEOUT_S
        while len(values) < count and time.monotonic() < end:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                values.append((message.value() or b"").decode())
        return values
    finally:
        consumer.close()


async def test_a_transaction_needs_begin(client: Client) -> None:
    topic = await new_topic(client, 1)
    async with TransactionalProducer(client, f"t-{uuid.uuid4().hex[:8]}") as producer:
        with pytest.raises(ClientError) as refused:
            await producer.send(topic, b"x", partition=0)
        assert refused.value.error == ErrorCode.INVALID_TXN_STATE


# -- the command line ----------------------------------------------------------------------------


async def cli(*args: str, stdin: str | None = None) -> str:
    """`raftbroker ARGS` (in a thread: the test's loop goes on), its stdout; it must succeed."""
    return cli_ok(await asyncio.to_thread(raftbroker, *args, stdin=stdin))


async def test_produce_with_a_transactional_id_writes_its_input_as_one_transaction(
    client: Client, three_nodes: launcher.LocalCluster
) -> None:
    topic = await new_topic(client, 1)
    at = ("--bootstrap", three_nodes.bootstrap[0])
    txn_id = f"cli-{topic}"
    done = await asyncio.to_thread(
        raftbroker, "produce", topic, "--transactional-id", txn_id, *at, stdin="a\nb\nc\n"
    )
    assert "in one transaction, committed" in cli_ok(done) + done.stderr
    # A line that cannot be sent (no key separator) aborts the whole input.
    failed = await asyncio.to_thread(
        raftbroker, "produce", topic, "--transactional-id", txn_id, "-K", ":", *at,
        stdin="k:d\nk:e\nno-separator\n",
    )  # fmt: skip
    assert failed.returncode != 0 and "transaction was aborted" in failed.stderr
    read = ("consume", topic, "--from-beginning", "--until-end", *at)
    assert (await cli(*read)).split() == ["a", "b", "c"]
    everything = await cli(*read, "--isolation-level", "read_uncommitted")
    assert everything.split() == ["a", "b", "c", "d", "e"]


async def test_transactions_list_describe_find_hanging_and_abort(
    client: Client, three_nodes: launcher.LocalCluster
) -> None:
    topic = await new_topic(client, 1)
    at = ("--bootstrap", three_nodes.bootstrap[0])
    txn_id = f"open-{topic}"
    async with TransactionalProducer(client, txn_id) as producer:
        producer.begin()
        await (await producer.send(topic, b"open", partition=0))
        listed = json.loads(await cli("transactions", "list", "--state", "Ongoing", "--json", *at))
        assert {"transactional_id": txn_id, "producer_id": producer.producer.producer_id,
                "state": "Ongoing"} in listed  # fmt: skip
        described = json.loads(await cli("transactions", "describe", txn_id, "--json", *at))
        assert (described["state"], described["partitions"]) == ("Ongoing", [f"{topic}-0"])
        producers = json.loads(await cli("producers", "describe", topic, "--json", *at))
        assert [row["txn_start_offset"] for row in producers] == [0]
        # Open past a timeout of 0, but its coordinator holds it: not hanging.
        hanging = "transactions", "find-hanging", topic, "--max-transaction-timeout-ms", "0"
        assert json.loads(await cli(*hanging, "--json", *at)) == []
        await cli("transactions", "abort", topic, "--partition", "0", "--start-offset", "0", *at)
        assert (
            json.loads(await cli("producers", "describe", topic, "--json", *at))[0][
                "txn_start_offset"
            ]
            == -1
        )
        read = ("consume", topic, "--from-beginning", "--until-end", "--format", "json", *at)
        assert await cli(*read) == ""  # aborted on the partition: never read committed
        await producer.abort()


# -- bad input -----------------------------------------------------------------------------------


async def call_txn(client: Client, txn_id: str, request: p.Request) -> p.Response:
    return await client.call_coordinator(txn_id, request, key_type=p.TXN_KEY, timeout_s=TIMEOUT_S)


async def test_transaction_requests_that_break_the_rules_are_refused_with_kafkas_codes(
    client: Client,
) -> None:
    topic = await new_topic(client, 1)
    txn_id = f"bad-{topic}"
    stranger = p.AddPartitionsToTxn(txn_id, 12_345, 0, (p.TxnPartition(topic, 0),))
    answer = await call_txn(client, txn_id, stranger)
    assert isinstance(answer, p.AddPartitionsToTxnResponse)
    assert [r.error for r in answer.results] == [ErrorCode.INVALID_PRODUCER_ID_MAPPING]
    async with TransactionalProducer(client, txn_id) as producer:
        pid, epoch = producer.producer.producer_id, producer.producer.epoch
        producer.begin()
        await (await producer.send(topic, b"x", partition=0))
        older = await call_txn(client, txn_id, p.EndTxn(txn_id, pid, epoch + 1, True))
        assert older == p.TxnErrorResponse(ErrorCode.PRODUCER_FENCED)
        missing = p.AddPartitionsToTxn(txn_id, pid, epoch, (p.TxnPartition(f"{topic}-no", 0),))
        unknown = await call_txn(client, txn_id, missing)
        assert isinstance(unknown, p.AddPartitionsToTxnResponse)
        assert [r.error for r in unknown.results] == [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
        bad_group = await call_txn(client, txn_id, p.AddOffsetsToTxn(txn_id, pid, epoch, ""))
        assert bad_group == p.TxnErrorResponse(ErrorCode.INVALID_GROUP_ID)
        # A TxnOffsetCommit without AddOffsetsToTxn: the group is not in the transaction.
        group = f"g-{topic}"
        entries = (p.CommitEntry(topic, 0, 1, ""),)
        commit = p.TxnOffsetCommit(txn_id, group, pid, epoch, -1, "", "", entries)
        refused = await client.call_coordinator(group, commit, timeout_s=TIMEOUT_S)
        assert isinstance(refused, p.OffsetCommitResponse)
        assert [r.error for r in refused.results] == [ErrorCode.INVALID_TXN_STATE]
        await producer.commit()
    # An id over its length bound never reaches a coordinator's log.
    too_long = "x" * 300
    answer = await client.send_any(p.FindCoordinator(too_long, p.TXN_KEY))
    assert isinstance(answer, p.FindCoordinatorResponse)
    assert answer.error == ErrorCode.INVALID_REQUEST
    assert await read_values(client, topic, until=1) == ["x"]
