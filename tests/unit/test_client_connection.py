"""The client's connection (cluster/client/connection.py): answers cut out of whatever the
socket hands over. A whole answer in one read takes a shortcut past the buffer; answers split
anywhere, several in one read, or a whole one after a part of the next go through the buffer.
Each case must match every answer to its request, whole and in order."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio

from cluster import native as p
from cluster.client.connection import Connection

ANSWER_TIMEOUT_S = 5.0
pytestmark = pytest.mark.asyncio(loop_scope="function")


@pytest_asyncio.fixture
async def connection() -> AsyncIterator[Connection]:
    """A real connection on one end of a socket pair (its requests go out there unread)."""
    ours, theirs = socket.socketpair()
    conn = Connection("127.0.0.1:1", frame_bytes_max=1 << 20)
    await asyncio.get_running_loop().create_connection(lambda: conn, sock=ours)
    try:
        yield conn
    finally:
        await conn.close()
        theirs.close()


def answer(correlation_id: int, offset: int) -> bytes:
    result = p.ProduceResult("t", 0, 0, offset, offset, 1_000, False, "")
    return p.encode_response(correlation_id, p.ProduceResponse((result,)))


def request() -> p.Produce:
    return p.Produce(1_000, (p.ProduceEntry("t", 0, b"batch"),))


Chunker = Callable[[bytes, int], list[bytes]]  # both answers, and the length of one
CHUNKERS: dict[str, Chunker] = {
    "each whole": lambda data, one: [data[:one], data[one:]],
    "byte by byte": lambda data, _one: [data[i : i + 1] for i in range(len(data))],
    "both at once": lambda data, _one: [data],
    "whole, then a part": lambda data, one: [data[: one + 3], data[one + 3 :]],
    "a part, then the rest": lambda data, _one: [data[:3], data[3:]],
}


@pytest.mark.parametrize("chunks", CHUNKERS.values(), ids=CHUNKERS.keys())
async def test_answers_are_matched_however_they_arrive(
    connection: Connection, chunks: Chunker
) -> None:
    first = asyncio.ensure_future(connection.request(request(), ANSWER_TIMEOUT_S))
    second = asyncio.ensure_future(connection.request(request(), ANSWER_TIMEOUT_S))
    await asyncio.sleep(0)  # one turn of the loop: both written, correlation ids 1 and 2
    one = answer(1, 10)
    data = one + answer(2, 11)
    for chunk in chunks(data, len(one)):
        connection.data_received(chunk)
    async with asyncio.timeout(ANSWER_TIMEOUT_S):
        got = await first, await second
    assert all(isinstance(r, p.ProduceResponse) for r in got)
    assert [r.results[0].base_offset for r in got] == [10, 11]  # type: ignore[attr-defined]


async def test_a_whole_answer_over_the_limit_fails_the_connection() -> None:
    small = Connection("127.0.0.1:1", frame_bytes_max=16)
    ours, theirs = socket.socketpair()
    await asyncio.get_running_loop().create_connection(lambda: small, sock=ours)
    try:
        pending = asyncio.ensure_future(small.request(request(), ANSWER_TIMEOUT_S))
        await asyncio.sleep(0)  # one turn of the loop: written, correlation id 1
        small.data_received(answer(1, 10))  # whole, in one read, but 18 bytes of body
        async with asyncio.timeout(ANSWER_TIMEOUT_S):
            with pytest.raises(Exception, match="exceeds the limit"):
                await pending
        assert small.closed
    finally:
        await small.close()
        theirs.close()
