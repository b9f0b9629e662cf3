"""Client-library properties that need a real socket but not a whole cluster."""

from __future__ import annotations

import asyncio

import pytest

from cluster.client import Cluster

pytestmark = pytest.mark.asyncio(loop_scope="function")


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
        cluster = Cluster([f"127.0.0.1:{port}"])
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
