"""Probes that the native listener already withstands, kept so they keep holding.

Each sends what no client would (random bytes, an oversize length prefix, a msgpack bomb,
wrong types), expects the node to refuse it or drop the connection, and ends with
`assert_intact`.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from tests.adversarial.conftest import SOCKET_TIMEOUT_S, Known, assert_intact, frame, open_raw

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def _send_and_drain(address: str, data: bytes) -> bytes:
    """Send `data`, then read until the node closes the connection or goes quiet."""
    reader, writer = await open_raw(address)
    try:
        writer.write(data)
        await writer.drain()
        received = b""
        try:
            async with asyncio.timeout(SOCKET_TIMEOUT_S):
                while chunk := await reader.read(65_536):
                    received += chunk
        except TimeoutError:
            pass  # a node may keep the connection open after answering: that is fine
        return received
    finally:
        writer.close()


async def test_random_bytes_are_refused(known: Known) -> None:
    rng = random.Random(19)
    address = known.cluster.nodes[0].client_address
    for _ in range(5):
        await _send_and_drain(address, rng.randbytes(rng.randrange(1, 4096)))
    await assert_intact(known)


async def test_a_4_gib_length_prefix_is_refused(known: Known) -> None:
    address = known.cluster.nodes[1].client_address
    await _send_and_drain(address, (0xFFFF_FFF0).to_bytes(4, "big") + b"x" * 1024)
    await assert_intact(known)


async def test_a_msgpack_bomb_is_refused(known: Known) -> None:
    # A msgpack array header claiming 2^32-1 elements, then nothing: a decoder that trusts it
    # would allocate for four billion items.
    address = known.cluster.nodes[2].client_address
    await _send_and_drain(address, frame(b"\xdd\xff\xff\xff\xff"))
    await assert_intact(known)
