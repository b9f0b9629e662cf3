"""The client server's answer deadline, on a real listener on loopback.

Every handler of a node answers within `request_timeout_ms`, so no node request can be left
unanswered any more; to see what the server does if a handler ever fails to answer (as an empty
Produce once did), the handler here is a stand-in that takes every Produce and never answers
it. The server must answer it REQUEST_TIMED_OUT at `Timing.answer_timeout_ms`, answer what was
pipelined behind it, and still close the connection once it goes idle.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from cluster import protocol as p
from cluster.broker.server import Respond, Server
from cluster.config import Limits, Timing
from statemachine.errors import ErrorCode

pytestmark = pytest.mark.asyncio(loop_scope="function")

HOST = "127.0.0.1"
TIMING = Timing(request_timeout_ms=100, answer_timeout_ms=400, client_idle_timeout_ms=600)
STATUS = p.ClusterStatusResponse(1, (), ())
WAIT_S = 5.0


class NeverAnswersProduce:
    """A RequestHandler that takes every Produce and never answers it; ClusterStatus at once."""

    def answer_now(self, request: p.Request, respond: Respond) -> bool:  # noqa: ARG002
        return isinstance(request, p.Produce)

    def answer_bytes_reserved(self, request: p.Request) -> int:  # noqa: ARG002
        return 0

    async def handle(self, request: p.Request) -> p.Response:  # noqa: ARG002
        return STATUS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


@pytest_asyncio.fixture
async def address() -> AsyncIterator[tuple[str, int]]:
    port = _free_port()
    server = Server(NeverAnswersProduce(), HOST, port, Limits(), TIMING)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(WAIT_S):
            await server.listening.wait()
        yield HOST, port
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


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
