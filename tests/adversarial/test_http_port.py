"""The HTTP port (GET /metrics, GET /healthz) against clients that are not HTTP clients.

Issue 19, defect 9: a request line over 64 KiB made asyncio log an unhandled
`LimitOverrunError` traceback (~25 lines) per request. Each probe here speaks raw bytes to a
real node's `http_port`, expects a one-line refusal (or a close) within the request deadline,
and ends with the endpoint still answering and `assert_intact` (which finds any traceback).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time

import pytest

from cluster.config import Limits, Timing
from cluster.local import launcher
from tests.adversarial.conftest import (
    SOCKET_TIMEOUT_S,
    Known,
    assert_intact,
    http_exchange,
    http_open,
)
from tests.polling import apoll_until

# alone: every node must answer /healthz 200 after each probe, which a metadata election moved
# by the other test worker's load would not.
pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.alone]

LIMITS = Limits()
DEADLINE_S = Timing().http_request_timeout_ms / 1000
# The node closes a request that missed its deadline within this much more.
SLACK_S = 3.0


def _status(response: bytes) -> int:
    """The status code of a response, 0 when there was none (the node only closed)."""
    parts = response.split(b" ", 2)
    return int(parts[1]) if response.startswith(b"HTTP/1.1 ") and len(parts) > 1 else 0


async def _assert_endpoint_serves(known: Known) -> None:
    for node in known.cluster.nodes:
        metrics = await http_exchange(node, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _status(metrics) == 200, metrics[:200]
        assert b"raftbroker_raft_commit_index" in metrics
        health = await http_exchange(node, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _status(health) == 200, health[:200]


async def test_an_oversize_request_line_is_refused_in_one_line(known: Known) -> None:
    node = known.cluster.nodes[0]
    for size in (LIMITS.http_head_bytes_max + 1, 70 * 1024, 1024 * 1024):
        line = b"GET /" + b"a" * size + b" HTTP/1.1\r\n\r\n"
        assert _status(await http_exchange(node, line)) == 431
    await _assert_endpoint_serves(known)
    await assert_intact(known)


async def test_an_oversize_head_is_refused(known: Known) -> None:
    node = known.cluster.nodes[1]
    too_many = b"".join(b"X-%d: y\r\n" % i for i in range(LIMITS.http_headers_max + 1))
    response = await http_exchange(node, b"GET /metrics HTTP/1.1\r\n" + too_many + b"\r\n")
    assert _status(response) == 431
    # Few headers, but more bytes than the head may hold, and no end of line in sight.
    huge = b"X-Big: " + b"b" * (2 * LIMITS.http_head_bytes_max)
    assert _status(await http_exchange(node, b"GET /metrics HTTP/1.1\r\n" + huge)) == 431
    await _assert_endpoint_serves(known)
    await assert_intact(known)


async def test_a_dripping_client_is_closed_at_the_deadline(known: Known) -> None:
    node = known.cluster.nodes[2]
    reader, writer = await http_open(node)
    started = time.monotonic()
    received = b""
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\n")
        # One byte of a header every 0.2 s, never ending it: a deadline that restarted with
        # every byte, or one per line, would never close this connection.
        while time.monotonic() - started < DEADLINE_S + SLACK_S:
            writer.write(b"x")
            await writer.drain()
            try:
                received = await asyncio.wait_for(reader.read(4096), 0.2)
            except TimeoutError:
                continue
            break  # an answer or the end of the connection
    except ConnectionError:
        pass  # the node closed it while we wrote: what we wanted
    finally:
        writer.close()
    elapsed = time.monotonic() - started
    assert elapsed < DEADLINE_S + SLACK_S, f"still open after {elapsed:.1f} s"
    assert elapsed >= DEADLINE_S - 0.5, f"closed after {elapsed:.1f} s, before the deadline"
    assert _status(received) in (0, 408), received[:200]
    await _assert_endpoint_serves(known)
    await assert_intact(known)


async def test_garbage_is_refused(known: Known) -> None:
    rng = random.Random(9)
    node = known.cluster.nodes[0]
    probes = [
        rng.randbytes(512) + b"\r\n\r\n",
        b"\x00\xff\xfe\r\n\r\n",
        b"GET\r\n\r\n",
        b"GET /metrics\r\n\r\n",
        b"GET /metrics HTTP/1.1 extra\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n",
        b"\r\n\r\n",
    ]
    for probe in probes:
        assert _status(await http_exchange(node, probe)) == 400, probe[:40]
    response = await http_exchange(node, b"POST /metrics HTTP/1.1\r\n\r\n")
    assert _status(response) == 405
    assert _status(await http_exchange(node, b"GET /nothing HTTP/1.1\r\n\r\n")) == 404
    await _assert_endpoint_serves(known)
    await assert_intact(known)


async def held_from(
    node: launcher.NodeProcess, sources: list[str], count: int
) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """`count` connections to the node's HTTP port from each of `sources`, held open."""
    held = []
    for source in sources:
        for _ in range(count):
            async with asyncio.timeout(SOCKET_TIMEOUT_S):
                held.append(
                    await asyncio.open_connection(node.host, node.http_port, local_addr=(source, 0))
                )
    return held


async def closed_unanswered(node: launcher.NodeProcess, source: str) -> bool:
    async with asyncio.timeout(SOCKET_TIMEOUT_S):
        reader, writer = await asyncio.open_connection(
            node.host, node.http_port, local_addr=(source, 0)
        )
    try:
        with contextlib.suppress(ConnectionError):
            writer.write(b"GET /healthz HTTP/1.1\r\n\r\n")
            await writer.drain()
        async with asyncio.timeout(SOCKET_TIMEOUT_S):
            return await reader.read() == b""
    except ConnectionError:
        return True
    finally:
        writer.close()


async def test_connections_past_the_limits_are_closed(known: Known) -> None:
    """One host holding its `http_connections_per_address_max` keeps nobody else out (a
    monitor from another address is served); past it, and past `http_connections_max` over
    many hosts, a connection is closed at once, unanswered."""
    node = known.cluster.nodes[1]
    per_address = LIMITS.http_connections_per_address_max
    held = await held_from(node, ["127.0.0.66"], per_address)
    try:
        assert await closed_unanswered(node, "127.0.0.66")
        assert _status(await http_exchange(node, b"GET /healthz HTTP/1.1\r\n\r\n")) == 200
        hosts = LIMITS.http_connections_max // per_address
        held += await held_from(node, [f"127.0.1.{i}" for i in range(hosts - 1)], per_address)
        assert await closed_unanswered(node, "127.0.0.1")
    finally:
        for _, writer in held:
            writer.close()

    async def served() -> bool:
        return _status(await http_exchange(node, b"GET /healthz HTTP/1.1\r\n\r\n")) == 200

    await apoll_until(served, 5.0, "the endpoint serving once the held connections closed")
    await _assert_endpoint_serves(known)
    await assert_intact(known)
