"""The client server's deadlines, on a real listener on loopback, with stand-in handlers.

The answer deadline: every handler of a node answers within `request_timeout_ms`, so no node
request can be left unanswered any more; to see what the server does if a handler ever fails to
answer (as an empty Produce once did), a stand-in takes every Produce and never answers it. The
server must answer it REQUEST_TIMED_OUT at `Timing.answer_timeout_ms`, answer what was
pipelined behind it, and still close the connection once it goes idle.

The frame-read deadline, while the client does not read its answers: a stand-in answers every
Fetch with a large response, so the server stops writing (and reading) with part of the next
frame buffered. That wait is the client's choice of pace for its answers, bounded by the write
timeout; it must not count against the frame (tests/adversarial/test_client_connections.py
covers the other pauses and a client that drips a frame, against real nodes).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from cluster import native as p
from cluster.broker.connection import RequestHandler
from cluster.broker.server import Server
from cluster.config import Limits, Timing
from cluster.native.wire import NativeWire, Respond
from statemachine.errors import ErrorCode

pytestmark = pytest.mark.asyncio(loop_scope="function")

HOST = "127.0.0.1"
TIMING = Timing(request_timeout_ms=100, answer_timeout_ms=400, client_idle_timeout_ms=600)
STATUS = p.ClusterStatusResponse(1, (), ())
WAIT_S = 5.0
FRAME_READ_TIMEOUT_MS = 200
LARGE_ANSWER = p.FetchResponse(
    (p.FetchResult("t", 0, 0, 1, 0, "", (p.FetchedBatch(0, 0, b"x" * (1 << 20)),)),)
)
# Answers in all: more than the write buffer, the sender's socket buffer (Linux lets it grow
# to 4 MiB) and the small receive buffer of the client below can hold, so the server pauses.
LARGE_ANSWERS = 8
CLIENT_RECEIVE_BUFFER_BYTES = 16 * 1024


class NeverAnswersProduce:
    """A RequestHandler that takes every Produce and never answers it; ClusterStatus at once."""

    def answer_now(self, request: p.Request, respond: Respond) -> bool:  # noqa: ARG002
        return isinstance(request, p.Produce)

    def answer_bytes_reserved(self, request: p.Request) -> int:  # noqa: ARG002
        return 0

    def answer_wait_s(self, request: p.Request) -> float:  # noqa: ARG002
        return 0.0

    async def handle(self, request: p.Request, source: str) -> p.Response:  # noqa: ARG002
        return STATUS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


class LargeFetchAnswers:
    """A RequestHandler that answers Fetch with `LARGE_ANSWER`, in a task; anything else with
    `STATUS`."""

    def answer_now(self, request: p.Request, respond: Respond) -> bool:  # noqa: ARG002
        return False

    def answer_bytes_reserved(self, request: p.Request) -> int:  # noqa: ARG002
        return 0

    def answer_wait_s(self, request: p.Request) -> float:  # noqa: ARG002
        return 0.0

    async def handle(self, request: p.Request, source: str) -> p.Response:  # noqa: ARG002
        return LARGE_ANSWER if isinstance(request, p.Fetch) else STATUS


@contextlib.asynccontextmanager
async def serving(
    handler: RequestHandler[p.Request, p.Response], timing: Timing, limits: Limits | None = None
) -> AsyncIterator[tuple[str, int]]:
    limits = limits or Limits()
    port = _free_port()
    server = Server(handler, HOST, port, limits, timing, wire=NativeWire(limits))
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(WAIT_S):
            await server.listening.wait()
        yield HOST, port
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest_asyncio.fixture
async def address() -> AsyncIterator[tuple[str, int]]:
    async with serving(NeverAnswersProduce(), TIMING) as address:
        yield address


async def _answer(
    reader: asyncio.StreamReader, request_type: type[p.Request]
) -> tuple[int, p.Response | p.ErrorResponse]:
    body = await p.read_frame(reader, Limits().frame_bytes_max)
    return p.decode_response(body, request_type)


async def test_an_unanswered_request_times_out_and_the_connection_still_idles_out(
    address: tuple[str, int],
) -> None:
    reader, writer = await asyncio.open_connection(*address)
    try:
        produce = p.Produce(1_000, ())
        writer.write(p.encode_request(1, produce) + p.encode_request(2, p.ClusterStatus()))
        await writer.drain()
        loop = asyncio.get_running_loop()
        sent = loop.time()
        async with asyncio.timeout(WAIT_S):
            correlation_id, answer = await _answer(reader, p.Produce)
            assert correlation_id == 1
            assert isinstance(answer, p.ErrorResponse)
            assert answer.error == ErrorCode.REQUEST_TIMED_OUT
            assert loop.time() - sent >= TIMING.answer_timeout_ms / 1000
            assert await _answer(reader, p.ClusterStatus) == (2, STATUS)
            # Nothing pending now: the idle check closes the silent connection.
            assert await reader.read() == b""
    finally:
        writer.close()


async def test_a_frame_waiting_while_the_client_reads_no_answers_is_not_timed() -> None:
    timing = Timing(frame_read_timeout_ms=FRAME_READ_TIMEOUT_MS)
    async with serving(LargeFetchAnswers(), timing) as address:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_RECEIVE_BUFFER_BYTES)
        sock.setblocking(False)
        async with asyncio.timeout(WAIT_S):
            await asyncio.get_running_loop().sock_connect(sock, address)
        reader, writer = await asyncio.open_connection(sock=sock)
        try:
            fetch = p.Fetch(0, 1 << 20, (), replica_read=False)
            requests = b"".join(p.encode_request(i, fetch) for i in range(1, LARGE_ANSWERS + 1))
            status = p.encode_request(LARGE_ANSWERS + 1, p.ClusterStatus())
            writer.write(requests + status[:-2])  # the last frame begun, not finished
            await writer.drain()
            # The client reads nothing for several frame deadlines (the scenario, not a wait
            # for something to happen): the server stops writing, and so reading.
            await asyncio.sleep(3 * FRAME_READ_TIMEOUT_MS / 1000)
            writer.write(status[-2:])
            async with asyncio.timeout(WAIT_S):
                for i in range(1, LARGE_ANSWERS + 1):
                    assert await _answer(reader, p.Fetch) == (i, LARGE_ANSWER)
                assert await _answer(reader, p.ClusterStatus) == (LARGE_ANSWERS + 1, STATUS)
        finally:
            writer.close()


async def _small_window_connection(
    address: tuple[str, int],
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection whose receive buffer is small, so a large answer is still on its way when
    the server decides to close."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_RECEIVE_BUFFER_BYTES)
    sock.setblocking(False)
    async with asyncio.timeout(WAIT_S):
        await asyncio.get_running_loop().sock_connect(sock, address)
    return await asyncio.open_connection(sock=sock)


async def test_a_bad_frame_closes_only_after_the_answers_before_it_are_read() -> None:
    """Issue 40, item 5: a close after a bad frame must not cut off an earlier large answer.
    The client pipelines a Fetch (a 1 MiB answer), a frame that does not decode, and then
    goes on writing. A socket closed with those bytes unread sends a reset, which destroyed
    the answer's tail (a 930 KB answer arrived as 128,000 bytes); the server must instead read
    and drop them, send its answer and a FIN, and close once the client has read it all."""
    async with serving(LargeFetchAnswers(), TIMING) as address:
        reader, writer = await _small_window_connection(address)
        try:
            fetch = p.encode_request(1, p.Fetch(0, 1 << 20, (), replica_read=False))
            undecodable = (1).to_bytes(4, "big") + b"\xc1"  # msgpack's one unused byte
            still_writing = b"\x00" * (4 << 20)
            writer.write(fetch + undecodable + still_writing)  # not drained: the client goes on
            async with asyncio.timeout(WAIT_S):
                assert await _answer(reader, p.Fetch) == (1, LARGE_ANSWER)
                assert await reader.read() == b""  # a FIN, not a reset
        finally:
            writer.close()


async def test_every_request_sent_before_the_clients_eof_is_answered() -> None:
    """A client that sends its requests and half-closes gets every answer, those of frames
    the server had not yet taken (held back by the in-flight bound) included, then a close."""
    limits = Limits(in_flight_requests_per_connection_max=2)
    count = 6
    async with serving(LargeFetchAnswers(), TIMING, limits) as address:
        reader, writer = await asyncio.open_connection(*address)
        try:
            frames = b"".join(p.encode_request(i, p.ClusterStatus()) for i in range(1, count + 1))
            writer.write(frames)
            writer.write_eof()
            async with asyncio.timeout(WAIT_S):
                for i in range(1, count + 1):
                    assert await _answer(reader, p.ClusterStatus) == (i, STATUS)
                assert await reader.read() == b""
        finally:
            writer.close()
