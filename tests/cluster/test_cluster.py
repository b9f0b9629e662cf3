"""Issue 3's cluster tests: a real 3-node cluster, real processes, SIGKILL, restarts.

The tests share one module cluster but nothing else: each creates its own topics and producers,
and starts from a whole cluster (`whole_cluster` restarts any node an earlier test left down and
waits until every node is ready), so any one of them passes alone and in any order. Tests that
kill nodes restart them before they end. Every wait polls a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import struct
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import pytest

from cluster import native as p
from cluster.client import (
    Admin,
    Client,
    ClientError,
    ConsumedRecord,
    Consumer,
    Producer,
    ProducerConfig,
    RecordMetadata,
    retrying,
)
from cluster.local import launcher
from statemachine.errors import ErrorCode
from statemachine.records import Record, RecordBatch
from tests.cluster.conftest import wait_ready
from tests.polling import apoll_until

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.usefixtures("whole_cluster")]


async def consume_all(
    cluster: Client, topic: str, expected: int, timeout_s: float = 60
) -> list[ConsumedRecord]:
    consumer = Consumer(cluster)
    await consumer.assign(topic)
    records: list[ConsumedRecord] = []

    async def enough() -> bool:
        records.extend(await consumer.poll(200))
        return len(records) >= expected

    await apoll_until(enough, timeout_s, f"{expected} records of {topic}", interval_s=0)
    records.extend(await consumer.poll(0))  # anything beyond `expected` is a duplicate
    return records


async def leader_of(cluster: Client, topic: str, partition: int, *, not_: int = -1) -> int:
    """The partition's leader as metadata reports it, once there is one other than `not_`."""

    async def elected() -> int | None:
        meta = await cluster.refresh([topic])
        leader = meta.topics[0].partitions[partition].leader_id
        return leader if leader not in (-1, not_) else None

    return await apoll_until(elected, 20, f"a leader of {topic}-{partition}", interval_s=0.1)


async def metadata_leader(cluster: Client, address: str, *, not_: int = -1) -> int:
    """The metadata group's leader as the node at `address` sees it, once one other than
    `not_` is elected."""

    async def elected() -> int | None:
        status = await Admin(cluster).cluster_status(address)
        leader = next(g.leader_id for g in status.groups if g.group == "__metadata")
        return leader if leader not in (-1, not_) else None

    return await apoll_until(elected, 20, "a metadata leader", interval_s=0.1)


async def kill_and_restart(
    three: launcher.LocalCluster,
    node_id: int,
    while_down: Callable[[], Awaitable[object]] | None = None,
) -> launcher.LocalCluster:
    """SIGKILL one node, await `while_down()` (a condition the test wants reached without it),
    and start the node again; the cluster with its new pid."""
    # Earlier tests restarted nodes: the running pids are in cluster.json, not in `three`.
    current = three.current()
    node = next(n for n in current.nodes if n.node_id == node_id)
    launcher.kill(node.pid, signal.SIGKILL, wait_s=10)
    if while_down is not None:
        await while_down()
    return launcher.restart_node(current, node_id)


async def test_10000_records_round_trip_complete_and_in_order(client: Client) -> None:
    await Admin(client).create_topic("orders", 3, 3)
    sent: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    async with Producer(client) as producer:
        futures = [
            await producer.send("orders", f"v{i}".encode(), key=f"k{i % 97}".encode())
            for i in range(10_000)
        ]
        metas: list[RecordMetadata] = list(await asyncio.gather(*futures))
    for i, meta in enumerate(metas):
        sent[meta.partition].append(f"v{i}".encode())
    records = await consume_all(client, "orders", 10_000)
    assert len(records) == 10_000
    for partition in range(3):
        mine = sorted((r for r in records if r.partition == partition), key=lambda r: r.offset)
        assert [r.offset for r in mine] == list(range(len(mine)))
        assert [r.value for r in mine] == sent[partition]
    # An acknowledgement names the producer identity the log holds for that record.
    identity = {
        (r.partition, r.offset): (r.producer_id, r.producer_epoch, r.sequence) for r in records
    }
    assert all(
        identity[(m.partition, m.offset)] == (m.producer_id, m.producer_epoch, m.sequence)
        for m in metas
    )
    assert {m.sequence for m in metas if m.partition == 0} == set(range(len(sent[0])))


async def raw_produce(cluster: Client, address: str, topic: str, batch: bytes) -> p.ProduceResult:
    response = await cluster.send(address, p.Produce(5_000, (p.ProduceEntry(topic, 0, batch),)))
    assert isinstance(response, p.ProduceResponse)
    return response.results[0]


async def produce_until_acked(cluster: Client, topic: str, batch: bytes) -> p.ProduceResult:
    """Send `batch` to the partition's leader until it is acknowledged (retrying any error)."""

    async def acked() -> p.ProduceResult | None:
        leader = await leader_of(cluster, topic, 0)
        address = next(a for n, a in cluster._brokers.items() if n == leader)
        try:
            result = await raw_produce(cluster, address, topic, batch)
        except ClientError:
            return None
        return result if result.error == ErrorCode.NONE else None

    return await apoll_until(acked, 30, f"a batch acknowledged on {topic}", interval_s=0.1)


async def test_leader_kill_during_produce_loses_and_duplicates_nothing(
    client: Client, three_nodes: launcher.LocalCluster
) -> None:
    await Admin(client).create_topic("failover", 1, 3)
    init = await client.send_any(p.InitProducerId("", 60_000, -1, -1))
    assert isinstance(init, p.InitProducerIdResponse)
    raw = RecordBatch(
        init.producer_id, 0, 0, tuple(Record(None, f"raw{i}".encode(), 1) for i in range(10))
    ).encode()
    original = await produce_until_acked(client, "failover", raw)
    assert not original.duplicate

    config = ProducerConfig(linger_ms=1, batch_size_bytes=2_000)
    async with Producer(client, config) as producer:
        futures = []
        for i in range(3_000):
            futures.append(await producer.send("failover", f"p{i}".encode()))
            if i == 1_000:  # with about 200 records in flight
                victim = await leader_of(client, "failover", 0)
                elected = partial(leader_of, client, "failover", 0, not_=victim)
                cluster = await kill_and_restart(three_nodes, victim, elected)
            if i % 100 == 0 and i >= 200:
                await futures[i - 200]  # paced by acknowledgements: records fly during the kill
        acked = await asyncio.gather(*futures)
    assert len(acked) == 3_000

    retry = await produce_until_acked(client, "failover", raw)  # across the leader change
    assert retry.duplicate
    assert (retry.base_offset, retry.last_offset) == (original.base_offset, original.last_offset)

    records = await consume_all(client, "failover", 3_010)
    values = [r.value for r in records]
    assert len(values) == len(set(values)) == 3_010
    assert {f"p{i}".encode() for i in range(3_000)} <= set(values)
    await wait_ready(cluster)


async def test_pids_are_unique_across_brokers_and_a_metadata_leader_kill(
    client: Client, three_nodes: launcher.LocalCluster
) -> None:
    async def pids_from_every_node(count: int) -> list[int]:
        found = []
        for address in three_nodes.bootstrap:
            for _ in range(count):
                r = await retrying(
                    lambda a=address: client.send(a, p.InitProducerId("", 60_000, -1, -1)), 10
                )
                assert isinstance(r, p.InitProducerIdResponse)
                assert r.epoch == 0
                found.append(r.producer_id)
        return found

    before = await pids_from_every_node(150)
    meta_leader = await metadata_leader(client, three_nodes.bootstrap[0])
    survivor = next(n.client_address for n in three_nodes.nodes if n.node_id != meta_leader)
    cluster = await kill_and_restart(
        three_nodes, meta_leader, lambda: metadata_leader(client, survivor, not_=meta_leader)
    )
    await wait_ready(cluster)
    after = await pids_from_every_node(150)
    every = before + after
    assert len(every) == len(set(every)) == 900


async def test_second_transactional_producer_fences_the_first(client: Client) -> None:
    await Admin(client).create_topic("fencing", 1, 3)
    config = ProducerConfig(transactional_id="settlements", linger_ms=0)
    async with Producer(client, config) as first:
        await (await first.send("fencing", b"from-first-0"))
        async with Producer(client, ProducerConfig(transactional_id="settlements")) as second:
            assert second.producer_id == first.producer_id
            assert second.epoch == first.epoch + 1
            await (await second.send("fencing", b"from-second"))
            zombie = await first.send("fencing", b"from-first-1")
            with pytest.raises(ClientError) as fenced:
                await zombie
            assert fenced.value.error in (
                ErrorCode.INVALID_PRODUCER_EPOCH,
                ErrorCode.PRODUCER_FENCED,
            )
            with pytest.raises(ClientError):
                await first.send("fencing", b"from-first-2")
    values = [r.value for r in await consume_all(client, "fencing", 2)]
    assert values == [b"from-first-0", b"from-second"]


async def test_all_nodes_killed_and_restarted_keep_records_and_producer_state(
    client: Client, three_nodes: launcher.LocalCluster
) -> None:
    await Admin(client).create_topic("durable", 2, 3)
    async with Producer(client, ProducerConfig(linger_ms=1)) as producer:
        futures = [
            await producer.send("durable", f"d{i}".encode(), partition=i % 2) for i in range(2_000)
        ]
        await asyncio.gather(*futures)
        pid = producer.producer_id
    describe = await Admin(client).describe_producers("durable")
    before = {d.partition: d.producers for d in describe}
    await client.close()

    current = three_nodes.current()
    for node in current.nodes:
        launcher.kill(node.pid, signal.SIGKILL, wait_s=10)
    for node in current.nodes:
        current = launcher.restart_node(current, node.node_id)
    await wait_ready(current)

    records = await consume_all(client, "durable", 2_000)
    assert sorted(r.value or b"" for r in records) == sorted(f"d{i}".encode() for i in range(2_000))
    after = {d.partition: d.producers for d in await Admin(client).describe_producers("durable")}
    assert after == before
    assert all(any(pd.producer_id == pid for pd in after[n]) for n in (0, 1))


def logged_since(log: Path, offset: int) -> str:
    """What a node logged after byte `offset` of its log."""
    with log.open() as f:
        f.seek(offset)
        return f.read()


def raw_frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


async def test_garbage_frames_get_errors_and_never_reach_a_log(
    client: Client, whole_cluster: launcher.LocalCluster
) -> None:
    await Admin(client).create_topic("garbage", 1, 3)
    three_nodes = whole_cluster
    node = three_nodes.nodes[0]
    end_before = await Admin(client).list_offsets("garbage", 0, -1)
    log = three_nodes.data_dir / f"node{node.node_id}.log"
    logged_before = log.stat().st_size
    payloads = [
        b"\x00\x00\x00\x05hello",  # a frame of non-msgpack bytes
        raw_frame(b"\x94\x02\x07\x63\x90"),  # unknown op 99 with a correlation id
        raw_frame(b"\x94\x02\x08\x05\x91\xc4\x03abc"),  # Produce with a wrong payload
        b"\x7f\xff\xff\xff" + b"x" * 100,  # a length prefix far over the frame limit
        b"\x00\x00",  # a truncated length prefix, then the connection closes
    ]
    for payload in payloads:
        with socket.create_connection((node.host, node.client_port), timeout=5) as s:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
            s.settimeout(5)
            try:
                while s.recv(65_536):
                    pass
            except OSError:
                pass
    status = await Admin(client).cluster_status(node.client_address)
    assert status.node_id == node.node_id
    assert await Admin(client).list_offsets("garbage", 0, -1) == end_before
    assert "Traceback" not in logged_since(log, logged_before)


async def test_a_client_that_leaves_mid_pipeline_does_not_wedge_the_node(
    client: Client, whole_cluster: launcher.LocalCluster
) -> None:
    node = whole_cluster.nodes[1]
    log = whole_cluster.data_dir / f"node{node.node_id}.log"
    logged_before = log.stat().st_size
    requests = b"".join(p.encode_request(i, p.ClusterStatus()) for i in range(1, 1_001))
    for _ in range(3):
        with socket.create_connection((node.host, node.client_port), timeout=5) as s:
            s.sendall(requests)  # 1,000 pipelined requests, and never read an answer
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    status = await Admin(client).cluster_status(node.client_address)
    assert status.node_id == node.node_id
    assert launcher.alive(node.pid)
    assert "Traceback" not in logged_since(log, logged_before)


async def test_a_leader_change_never_answers_a_sequence_error(
    client: Client, three_nodes: launcher.LocalCluster
) -> None:
    # SEMANTICS 10-12: across a leader SIGKILL, every answer to a batch is success, a duplicate
    # with the original offsets, or a retriable error; never OUT_OF_ORDER or a fatal error.
    await Admin(client).create_topic("answers", 1, 3)
    init = await client.send_any(p.InitProducerId("", 60_000, -1, -1))
    assert isinstance(init, p.InitProducerIdResponse)
    answers: list[ErrorCode] = []
    offsets: list[int] = []
    current = three_nodes

    async def answered(batch: bytes) -> p.ProduceResult | None:
        """One attempt: the success, or None after a retriable error (which is recorded)."""
        address = client.leader_address("answers", 0) or three_nodes.bootstrap[0]
        try:
            result = await raw_produce(client, address, "answers", batch)
        except ClientError as exc:
            if not exc.retriable:
                raise
            await client.refresh(["answers"])
            return None
        answers.append(ErrorCode(result.error))
        if result.error == ErrorCode.NONE:
            return result
        assert ErrorCode(result.error).retriable, ErrorCode(result.error).name
        await client.refresh(["answers"])
        return None

    for seq in range(300):
        batch = RecordBatch(init.producer_id, 0, seq, (Record(None, f"a{seq}".encode(), 1),))
        if seq == 100:
            current = await kill_and_restart(current, await leader_of(client, "answers", 0))
        attempt = partial(answered, batch.encode())
        result = await apoll_until(attempt, 30, f"batch {seq} acknowledged", interval_s=0)
        offsets.append(result.base_offset)
    assert ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER not in answers
    assert offsets == list(range(300))  # each batch once, in order, retries deduplicated
    values = [r.value for r in await consume_all(client, "answers", 300)]
    assert values == [f"a{i}".encode() for i in range(300)]
    await wait_ready(current)


async def test_pipelined_answers_keep_request_order_across_fast_and_slow_requests(
    client: Client,
) -> None:
    # A produce is answered from the apply callback, everything else from a task: on one
    # connection the answers must still leave in the order of the requests (as Kafka's do).
    await Admin(client).create_topic("ordered", 1, 3)
    await client.refresh(["ordered"])
    leader = client.leader_address("ordered", 0)
    assert leader is not None
    host, _, port = leader.rpartition(":")

    def produce(value: bytes) -> p.Produce:
        batch = RecordBatch(-1, -1, -1, (Record(None, value, 1),)).encode()
        return p.Produce(5_000, (p.ProduceEntry("ordered", 0, batch),))

    requests: list[p.Request] = [
        p.Metadata(("ordered",)),
        produce(b"first"),
        p.ClusterStatus(),
        produce(b"second"),
        p.Produce(5_000, (p.ProduceEntry("no-such-topic", 0, produce(b"x").entries[0].batch),)),
        p.ListOffsets((p.OffsetQuery("ordered", 0, -2),)),
        produce(b"third"),
    ]
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"".join(p.encode_request(i, r) for i, r in enumerate(requests, 1)))
        answers: list[tuple[int, p.Response | p.ErrorResponse]] = []
        async with asyncio.timeout(10):
            for _ in requests:
                body = await p.read_frame(reader, 1 << 20)
                answers.append(p.decode_response(body, type(requests[len(answers)])))
    finally:
        writer.close()
    assert [cid for cid, _ in answers] == list(range(1, len(requests) + 1))
    produced = [a.results[0] for _, a in answers if isinstance(a, p.ProduceResponse)]
    assert [ErrorCode(r.error) for r in produced] == [
        ErrorCode.NONE,
        ErrorCode.NONE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.NONE,
    ]
    first, second, _, third = produced
    assert (second.base_offset, third.base_offset) == (first.base_offset + 1, first.base_offset + 2)
