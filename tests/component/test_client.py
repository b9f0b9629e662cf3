"""Client-library properties that need a real socket but not a whole cluster."""

from __future__ import annotations

import asyncio
import itertools
import queue
import socket
import socketserver
import threading
import time

import pytest

from cluster import native as p
from cluster.client import CallTimeoutError, Client, Consumer, RetryPolicy
from cluster.client.producer import Producer, ProducerConfig
from cluster.config import Limits
from statemachine.errors import ErrorCode
from statemachine.records import RecordBatch

pytestmark = pytest.mark.asyncio(loop_scope="function")
ANSWER_WAIT_S = 5.0


async def test_concurrent_first_requests_share_one_connection() -> None:
    # Two connections to one broker would let a later batch overtake an earlier one (a
    # spurious OUT_OF_ORDER): the first requests of a window must share a connection.
    accepted = 0

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        await reader.read()  # hold the connection open until the client closes it
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        cluster = Client([f"127.0.0.1:{port}"])
        try:
            conns = await asyncio.gather(
                *(cluster.connection(f"127.0.0.1:{port}") for _ in range(5))
            )
            assert len({id(c) for c in conns}) == 1
            deadline = asyncio.get_running_loop().time() + 5
            while accepted < 1:
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.01)
            assert accepted == 1
        finally:
            await cluster.close()


def refused_address() -> str:
    """A loopback address where nothing listens (the port was free a moment ago)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def test_a_call_nobody_answers_fails_in_one_line_when_its_timeout_is_spent() -> None:
    address = refused_address()
    cluster = Client([address], retry=RetryPolicy(timeout_s=0.5))
    started = time.monotonic()
    try:
        with pytest.raises(CallTimeoutError) as failed:
            await cluster.metadata(["orders"])
    finally:
        await cluster.close()
    assert 0.5 <= time.monotonic() - started < 1.5  # retried until then, not past it
    assert str(failed.value).startswith(
        f"no broker served Metadata within 500 ms (last: NETWORK_EXCEPTION from {address}: "
        "ConnectionRefusedError("
    )
    assert "\n" not in str(failed.value)
    assert failed.value.error == ErrorCode.NETWORK_EXCEPTION
    assert failed.value.unreachable  # the CLI says "cannot reach the cluster"


async def test_a_silent_broker_cannot_hold_a_call_past_its_timeout() -> None:
    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # accepts, reads, never answers
        writer.close()

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server:
        # A request may wait 10 s, the call only 0.5 s: each request is cut to what is left.
        cluster = Client([address], request_timeout_s=10, retry=RetryPolicy(timeout_s=0.5))
        started = time.monotonic()
        try:
            with pytest.raises(CallTimeoutError) as failed:
                await cluster.call_leader("orders", 0, p.ListOffsets(()))
        finally:
            await cluster.close()
    assert time.monotonic() - started < 1.5
    assert str(failed.value).startswith(
        f"no leader for orders-0 answered within 500 ms (last: REQUEST_TIMED_OUT from {address}"
    )
    assert failed.value.error == ErrorCode.REQUEST_TIMED_OUT  # not a broken connection


class _OnePartitionBroker(socketserver.ThreadingTCPServer):
    """A broker of one partition ("t"-0, led by itself) on blocking sockets in threads, which
    notes each Produce's record as it reads it: a test can wait for one with its own loop
    blocked, so what arrives was written before the loop ran again."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _BrokerConnection)
        self.address = f"127.0.0.1:{self.server_address[1]}"
        self.produced: queue.Queue[bytes | None] = queue.Queue()
        self.offsets = itertools.count()

    def answer(self, request: p.Request) -> p.Response:
        match request:
            case p.Metadata():
                partition = p.PartitionMetadata(0, 1, (1,), 1)
                topic = p.TopicMetadata("t", ErrorCode.NONE, 1, (partition,))
                return p.MetadataResponse("c", 1, (p.BrokerAddress(1, self.address),), (topic,))
            case p.InitProducerId():
                return p.InitProducerIdResponse(1_000, 0)
            case p.Produce(entries=(entry,)):
                offset = next(self.offsets)
                self.produced.put(RecordBatch.decode(entry.batch).records[0].value)
                result = p.ProduceResult("t", 0, ErrorCode.NONE, offset, offset, 1, False, "")
                return p.ProduceResponse((result,))
        raise AssertionError(f"unexpected {request!r}")


class _BrokerConnection(socketserver.StreamRequestHandler):
    server: _OnePartitionBroker

    def handle(self) -> None:
        while head := self.rfile.read(p.LENGTH_PREFIX.size):
            (length,) = p.LENGTH_PREFIX.unpack(head)
            correlation_id, request = p.decode_request(self.rfile.read(length), Limits())
            self.wfile.write(p.encode_response(correlation_id, self.server.answer(request)))


async def test_with_linger_0_a_send_is_written_before_send_returns() -> None:
    # The sequential writer's latency: a record sent while its partition's sender waits goes
    # out in the caller's turn of the loop, not one wakeup of the sender's task later.
    broker = _OnePartitionBroker()
    threading.Thread(target=broker.serve_forever, daemon=True).start()
    cluster = Client([broker.address])
    try:
        async with Producer(cluster, ProducerConfig(linger_ms=0.0)) as producer:
            await (await producer.send("t", b"first"))  # starts the partition's sender task
            assert broker.produced.get(timeout=ANSWER_WAIT_S) == b"first"
            for offset, value in enumerate((b"second", b"third"), start=1):
                acked = await producer.send("t", value)
                # Blocking: this loop runs nothing until the broker has read the record.
                assert broker.produced.get(timeout=ANSWER_WAIT_S) == value
                assert (await acked).offset == offset
    finally:
        await cluster.close()
        broker.shutdown()
        broker.server_close()


async def test_a_stall_lasts_as_long_as_the_clients_clock_says() -> None:
    """How long a partition has had no leader answering is read from the client's clock
    (RetryPolicy.clock), as a call's deadline is: the CLI's `consume` fails on it. Driven
    here, it is judged 30 s old at once, with nothing listening and no real wait."""
    now_s = [100.0]
    client = Client([refused_address()], retry=RetryPolicy(timeout_s=0.5, clock=lambda: now_s[0]))
    consumer = Consumer(client)
    try:
        await consumer.seek("orders", 0, 5)  # an absolute offset: nothing to ask a broker
        assert await consumer.poll(0) == []
        assert ("orders", 0) in consumer.stalled
        assert consumer.stall_error(at_least_s=30) is None
        now_s[0] += 30
        error = consumer.stall_error(at_least_s=30)
        assert isinstance(error, CallTimeoutError)
        assert "no leader for orders-0 answered" in str(error)
    finally:
        await client.close()
