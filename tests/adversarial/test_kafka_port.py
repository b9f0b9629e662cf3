"""The Kafka port against bytes no Kafka client sends, and the native port's limits on it.

Kafka has no error frame: a request it cannot parse closes the connection. So here every bad
input must end in a closed connection (or, for ApiVersions newer than ours, a v0 answer on a
connection that stays open), never a crash, a traceback, a hung connection or an entry in any
log; the node answers on both ports afterwards (`assert_intact`, and an ApiVersions on a fresh
Kafka connection). The same Server runs both listeners, so the limits of the client port hold
here too: this module's cluster runs with a small per-address limit and a short frame-read
deadline, and both are seen acting on the Kafka port, counted under its own listener label.
"""

from __future__ import annotations

import asyncio
import os
import re
import struct

import pytest
from crc32c import crc32c

from cluster.kafka import codec
from cluster.kafka import messages as m
from cluster.local import launcher
from statemachine.errors import ErrorCode
from statemachine.records import Record, RecordBatch
from tests.adversarial.conftest import (
    KNOWN_PARTITIONS,
    KNOWN_TOPIC,
    SOCKET_TIMEOUT_S,
    Known,
    assert_intact,
    current_cluster,
    http_exchange,
)
from tests.kafka_wire import calls_on, kafka_call, kafka_calls, open_kafka, read_kafka_frame
from tests.polling import apoll_until

pytestmark = pytest.mark.asyncio(loop_scope="function")

PER_ADDRESS_MAX = 6
FRAME_READ_TIMEOUT_S = 1.0
EXTRA_TOML = f"""
[limits]
connections_per_address_max = {PER_ADDRESS_MAX}

[timing]
frame_read_timeout_ms = {int(FRAME_READ_TIMEOUT_S * 1000)}
refusal_log_interval_ms = 1000
"""
CLOSE_S = 2.0  # a refused or undecodable connection is closed at once: well within this
RANDOM_PAYLOADS = 40


@pytest.fixture(scope="module")
def known_toml() -> str:
    return EXTRA_TOML


def kafka_of(known: Known, node_id: int = 1) -> launcher.NodeProcess:
    return next(n for n in current_cluster(known).nodes if n.node_id == node_id)


async def closed_after(address: str, data: bytes) -> bool:
    """Send `data` on a fresh Kafka connection: whether the node closes it, answering nothing."""
    reader, writer = await open_kafka(address)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(CLOSE_S):
            return await reader.read() == b""
    except ConnectionError:
        return True
    finally:
        writer.close()


async def still_answers(known: Known) -> None:
    """Every node answers ApiVersions on a fresh Kafka connection, and the cluster is whole."""
    for node in current_cluster(known).nodes:
        answer = await kafka_call(node.kafka_address, m.Api.API_VERSIONS, 3, API_VERSIONS)
        assert isinstance(answer, m.ApiVersionsResponse)
        assert answer.error_code == 0
    await assert_intact(known)


async def refused(node: launcher.NodeProcess, reason: str) -> float:
    metrics = await http_exchange(node, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    pattern = rb'raftbroker_refused_connections_total\{listener="kafka",reason="%s"\} (\S+)'
    found = re.search(pattern % reason.encode(), metrics)
    assert found is not None, metrics[:300]
    return float(found[1])


API_VERSIONS = m.ApiVersionsRequest("raftbroker-tests", "1")


def header(api: int, version: int, correlation_id: int = 1) -> bytes:
    return struct.pack(">hhih", api, version, correlation_id, -1)


def framed(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


async def test_random_bytes_close_the_connection(known: Known) -> None:
    address = kafka_of(known).kafka_address
    for i in range(RANDOM_PAYLOADS):
        payload = os.urandom(1 + i * 37 % 300)
        # as they come (a length of anything), and framed (a header of anything)
        assert await closed_after(address, payload), payload.hex()
        assert await closed_after(address, framed(payload)), payload.hex()
    await still_answers(known)


async def test_lengths_no_client_sends(known: Known) -> None:
    node = kafka_of(known, 2)
    before = await refused(node, "undecodable_request")
    for length in (2**31 - 1, 64 * 1024 * 1024, -1, -(2**31)):  # oversize, negative
        assert await closed_after(node.kafka_address, struct.pack(">i", length) + b"\x00" * 64)
    assert await closed_after(node.kafka_address, framed(b""))  # no header at all
    assert await closed_after(node.kafka_address, framed(b"\x00\x03"))

    async def counted() -> bool:
        return await refused(node, "undecodable_request") >= before + 6

    await apoll_until(counted, SOCKET_TIMEOUT_S, "the refusals counted under listener kafka")
    await still_answers(known)


async def test_unknown_api_keys_and_versions(known: Known) -> None:
    address = kafka_of(known).kafka_address
    for api, version in ((999, 0), (-1, 0), (68, 0), (m.Api.METADATA, 99), (m.Api.FETCH, 0)):
        assert await closed_after(address, framed(header(api, version) + b"\x00" * 8))
    # ApiVersions newer than ours: answered in v0 with our versions, and the connection stays
    reader, writer = await open_kafka(address)
    try:
        writer.write(framed(header(m.Api.API_VERSIONS, 99, 77) + b"\xff" * 20))
        correlation_id, answer = codec.decode_api_versions_fallback(await read_kafka_frame(reader))
        assert (correlation_id, answer.error_code) == (77, 35)
        assert {k.api_key for k in answer.api_keys} == set(codec.SUPPORTED)
        (metadata,) = await calls_on(reader, writer, [(m.Api.METADATA, 12, m.MetadataRequest())])
        assert isinstance(metadata, m.MetadataResponse)
        assert [b.node_id for b in metadata.brokers] == [1, 2, 3]
    finally:
        writer.close()
    await still_answers(known)


async def test_malformed_bodies_and_truncations(known: Known) -> None:
    address = kafka_of(known, 3).kafka_address
    valid = codec.encode_request(
        m.RequestHeader(m.Api.CREATE_TOPICS, 7, 5, "x"),
        m.CreateTopicsRequest((m.CreatableTopic("made-by-a-broken-frame", 1, 1),)),
    )
    for cut in range(8, len(valid) - 1, 3):  # a frame whose length says what it has: short
        assert await closed_after(address, framed(valid[4:cut]))
    # a count that claims 2^31-1 topics, and a compact one that claims 2^32
    assert await closed_after(address, framed(header(m.Api.METADATA, 4) + b"\x7f\xff\xff\xff"))
    huge = header(m.Api.METADATA, 12) + b"\x00" + b"\xff\xff\xff\xff\x0f"
    assert await closed_after(address, framed(huge))
    await still_answers(known)
    topics = await kafka_call(address, m.Api.METADATA, 12, m.MetadataRequest())
    assert isinstance(topics, m.MetadataResponse)
    assert "made-by-a-broken-frame" not in {t.name for t in topics.topics}


async def test_batches_kafka_would_refuse_append_nothing(known: Known) -> None:
    """A corrupted CRC, a lying record count, transactional batches without a producer id or
    a registered transaction, a control batch, two batches where v3+
    takes one, a batch past batch_bytes_max: each refused on every partition of `known` at its
    leader (the others say NOT_LEADER_OR_FOLLOWER), and `assert_intact` finds `known` as it was."""
    good = RecordBatch(-1, -1, -1, (Record(b"k", b"forged", 1),) * 2).encode()
    idempotent = RecordBatch(4_242, 0, 0, (Record(b"k", b"forged", 1),)).encode()
    bad = [
        good[:-1] + bytes([good[-1] ^ 0xFF]),  # the CRC no longer matches
        good[:57] + (5).to_bytes(4, "big") + good[61:],  # record count against last offset delta
        resealed(good[:21] + (0x10).to_bytes(2, "big") + good[23:]),  # transactional, no pid
        # a transaction no coordinator registered; a control batch (the broker's to write)
        resealed(idempotent[:21] + (0x10).to_bytes(2, "big") + idempotent[23:]),
        resealed(idempotent[:21] + (0x30).to_bytes(2, "big") + idempotent[23:]),
        good + good,
        good + bytes(1 << 20),  # past batch_bytes_max (1 MiB)
    ]
    produces = [
        (m.Api.PRODUCE, 9, produce_to(KNOWN_TOPIC, partition, batch))
        for batch in bad
        for partition in range(KNOWN_PARTITIONS)
    ]
    refused_with: set[int] = set()
    for node in current_cluster(known).nodes:
        for answer in await kafka_calls(node.kafka_address, produces):
            assert isinstance(answer, m.ProduceResponse)
            refused_with.update(
                p.error_code for t in answer.responses for p in t.partition_responses
            )
    assert ErrorCode.NONE not in refused_with
    kinds = {
        ErrorCode.CORRUPT_MESSAGE,
        ErrorCode.INVALID_RECORD,
        ErrorCode.MESSAGE_TOO_LARGE,
        ErrorCode.INVALID_TXN_STATE,
    }
    assert kinds <= refused_with
    await still_answers(known)


def produce_to(topic: str, partition: int, batch: bytes) -> m.ProduceRequest:
    data = (m.TopicProduceData(topic, (m.PartitionProduceData(partition, batch),)),)
    return m.ProduceRequest(-1, 5_000, data)


def resealed(batch: bytes) -> bytes:
    """The batch with its CRC-32C computed again (after a field it covers was changed)."""
    return batch[:17] + crc32c(batch[21:]).to_bytes(4, "big") + batch[21:]


async def test_a_truncated_frame_is_closed_at_the_frame_deadline(known: Known) -> None:
    node = kafka_of(known)
    before = await refused(node, "frame_read_timeout")
    reader, writer = await open_kafka(node.kafka_address)
    loop = asyncio.get_running_loop()
    try:
        frame = codec.encode_request(m.RequestHeader(m.Api.API_VERSIONS, 3, 1, "x"), API_VERSIONS)
        writer.write(frame[:-3])  # the rest never comes
        await writer.drain()
        started = loop.time()
        async with asyncio.timeout(FRAME_READ_TIMEOUT_S + CLOSE_S):
            assert await reader.read() == b""
        assert loop.time() - started >= FRAME_READ_TIMEOUT_S * 0.9
    finally:
        writer.close()
    assert await refused(node, "frame_read_timeout") == before + 1
    await still_answers(known)


async def test_the_per_address_limit_holds_on_the_kafka_port(known: Known) -> None:
    node = kafka_of(known, 2)
    source = "127.0.0.77"  # as from one other host
    host, _, port = node.kafka_address.rpartition(":")
    sockets = []
    try:
        for _ in range(PER_ADDRESS_MAX):
            async with asyncio.timeout(SOCKET_TIMEOUT_S):
                sockets.append(
                    await asyncio.open_connection(host, int(port), local_addr=(source, 0))
                )
        for reader, writer in sockets:  # each one held is served
            (answer,) = await calls_on(reader, writer, [(m.Api.API_VERSIONS, 3, API_VERSIONS)])
            assert isinstance(answer, m.ApiVersionsResponse)
        async with asyncio.timeout(SOCKET_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(host, int(port), local_addr=(source, 0))
        sockets.append((reader, writer))
        async with asyncio.timeout(CLOSE_S):
            assert await reader.read() == b"", "a connection past the per-address limit served"
    finally:
        for _, writer in sockets:
            writer.close()
    assert await refused(node, "connections_per_address_max") >= 1
    await still_answers(known)


def fetch(topics: tuple[m.FetchTopic, ...], max_wait_ms: int = 4_000) -> m.FetchRequest:
    return m.FetchRequest(max_wait_ms, 1, topics)


@pytest.mark.alone  # /healthz 200 meanwhile, answers timed
async def test_a_fetch_with_nothing_to_wait_for_is_answered_at_once(known: Known) -> None:
    """Kafka answers a Fetch at once when no partition it leads could fill it. Such a Fetch
    (no topic, only partition -1, an unknown topic) once spun the node's loop without
    yielding until its max_wait: one 40-byte request froze the node, Raft included, for up to
    an hour. Each must now be answered well before its max_wait, and /healthz meanwhile."""
    node = kafka_of(known)
    nothing = (
        fetch(()),
        fetch((m.FetchTopic(KNOWN_TOPIC, (m.FetchPartition(-1, 0, 1 << 20),)),)),
        fetch((m.FetchTopic("no-such-topic", (m.FetchPartition(0, 0, 1 << 20),)),)),
    )
    loop = asyncio.get_running_loop()
    for request in nothing:
        started = loop.time()
        health = asyncio.create_task(http_exchange(node, b"GET /healthz HTTP/1.1\r\n\r\n"))
        (answer,) = await kafka_calls(node.kafka_address, [(m.Api.FETCH, 12, request)])
        assert b" 200 " in await health
        assert loop.time() - started < request.max_wait / 1000 / 4, request
        assert isinstance(answer, m.FetchResponse)
        codes = {p.error_code for t in answer.responses for p in t.partitions}
        assert codes <= {ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}, request
    await still_answers(known)


async def test_a_kafka_fetch_listing_one_partition_1024_times_is_refused(known: Known) -> None:
    """Issue 19's Fetch amplification, through the Kafka listener: the partition listed twice
    or more is refused whole (INVALID_REQUEST on each entry), nothing is read for it."""
    partitions = (m.FetchPartition(0, 0, 1 << 20),) * 1_024
    request = m.FetchRequest(0, 1, (m.FetchTopic(KNOWN_TOPIC, partitions),))
    for node in current_cluster(known).nodes:
        (answer,) = await kafka_calls(node.kafka_address, [(m.Api.FETCH, 12, request)])
        assert isinstance(answer, m.FetchResponse)
        entries = [p for t in answer.responses for p in t.partitions]
        assert len(entries) == 1_024
        assert {p.error_code for p in entries} == {ErrorCode.INVALID_REQUEST}
        assert not any(p.records for p in entries)
    await still_answers(known)


async def test_an_empty_produce_is_answered_and_so_is_the_next(known: Known) -> None:
    """Issue 19, defect 2, through the Kafka listener: a Produce with no topic is answered
    (empty, as Kafka answers it), and a request pipelined behind it is answered too."""
    empty = m.ProduceRequest(-1, 5_000, ())
    answers = await kafka_calls(
        kafka_of(known, 2).kafka_address,
        [(m.Api.PRODUCE, 9, empty), (m.Api.API_VERSIONS, 3, API_VERSIONS)],
    )
    assert answers[0] == m.ProduceResponse(())
    assert isinstance(answers[1], m.ApiVersionsResponse)
    await still_answers(known)


async def test_a_produce_to_a_topic_that_does_not_exist_is_unknown(known: Known) -> None:
    """Issue 19, defect 10, through the Kafka listener: not the retriable
    NOT_LEADER_OR_FOLLOWER that Kafka's clients retry for minutes."""
    batch = RecordBatch(-1, -1, -1, (Record(b"k", b"nowhere", 1),)).encode()
    for node in current_cluster(known).nodes:
        for topic, partition in (("no-such-topic", 0), (KNOWN_TOPIC, KNOWN_PARTITIONS)):
            request = produce_to(topic, partition, batch)
            (answer,) = await kafka_calls(node.kafka_address, [(m.Api.PRODUCE, 9, request)])
            assert isinstance(answer, m.ProduceResponse)
            (response,) = answer.responses[0].partition_responses
            assert response.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, (topic, node)
    await still_answers(known)
