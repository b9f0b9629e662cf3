"""The client port against hosts that hoard connections and clients that drip frames.

Issue 19, defect 3: one process holding ~3,100 idle sockets made every client of the cluster
get "cannot reach the cluster", peers' status polls included, and a client dripping a byte a
second inside a frame was never closed. This module's cluster runs with small limits
(`EXTRA_TOML`) so that filling them takes a few dozen sockets; the sockets come from source
addresses of their own on 127.0.0.0/8, as from other hosts. Each test ends with
`assert_intact`.
"""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from cluster import native as p
from cluster.broker.peers import STALE_AFTER_S
from cluster.client import Admin, Client, Consumer, Producer
from cluster.local import launcher
from tests.adversarial.conftest import (
    KNOWN_TOPIC,
    SOCKET_TIMEOUT_S,
    Known,
    assert_intact,
    current_cluster,
    exchange,
    http_exchange,
    leaders,
    node_pid,
    read_answer,
)
from tests.polling import apoll_until

pytestmark = pytest.mark.asyncio(loop_scope="function")

CONNECTIONS_MAX = 48
PER_ADDRESS_MAX = 16
IN_FLIGHT_MAX = 8
FRAME_READ_TIMEOUT_S = 1.0
REFUSAL_LOG_INTERVAL_S = 1.0
EXTRA_TOML = f"""
[limits]
connections_max = {CONNECTIONS_MAX}
connections_per_address_max = {PER_ADDRESS_MAX}
in_flight_requests_per_connection_max = {IN_FLIGHT_MAX}

[timing]
frame_read_timeout_ms = {int(FRAME_READ_TIMEOUT_S * 1000)}
refusal_log_interval_ms = {int(REFUSAL_LOG_INTERVAL_S * 1000)}
"""
# A refused connection is closed at once: well within this.
CLOSE_S = 1.0
# A node closes a frame past its deadline within this much more (timer and scheduling).
SLACK_S = 1.0
DRIP_S = 0.15
RESTART_S = 15.0
PER_ADDRESS_KIND = f"connections_per_address_max ({PER_ADDRESS_MAX}) reached"
FRAME_KIND = "frame not read within frame_read_timeout_ms"


@pytest.fixture(scope="module")
def known_toml() -> str:
    return EXTRA_TOML


# -- sockets from other addresses --------------------------------------------------------------

Socket = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def open_from(address: str, source: str) -> Socket:
    """A connection to `address` from the loopback address `source`, as from another host."""
    host, _, port = address.rpartition(":")
    async with asyncio.timeout(SOCKET_TIMEOUT_S):
        return await asyncio.open_connection(host, int(port), local_addr=(source, 0))


async def closed_within(socket: Socket, timeout_s: float) -> bool:
    """Whether the node closes this connection (on which we send nothing) within `timeout_s`."""
    try:
        async with asyncio.timeout(timeout_s):
            return await socket[0].read(1) == b""
    except TimeoutError:
        return False
    except ConnectionError:
        return True


async def open_many(address: str, source: str, count: int) -> list[Socket]:
    # One after another: a burst of connects could overflow the listen backlog, and a dropped
    # SYN is retried a second later (that is the kernel's, not the node's, delay).
    return [await open_from(address, source) for _ in range(count)]


def close_all(sockets: list[Socket]) -> None:
    for _, writer in sockets:
        writer.close()


# -- what the node reports ---------------------------------------------------------------------


def warnings_of(known: Known, node_id: int, kind: str) -> list[str]:
    text = (known.cluster.data_dir / f"node{node_id}.log").read_text(errors="replace")
    return [line for line in text.splitlines() if " WARNING " in line and kind in line]


async def refused_metric(node: launcher.NodeProcess, reason: str) -> float:
    response = await http_exchange(node, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    pattern = (
        rb'raftbroker_refused_connections_total\{listener="client",reason="%s"\} (\S+)'
        % reason.encode()
    )
    found = re.search(pattern, response)
    assert found is not None, response[:300]
    return float(found[1])


async def reachable_peers(socket: Socket) -> set[int]:
    """The nodes a node reports reachable, asked on an open connection."""
    reader, writer = socket
    writer.write(p.encode_request(1, p.ClusterStatus()))
    await writer.drain()
    _, status = await read_answer(reader, p.ClusterStatus)
    assert isinstance(status, p.ClusterStatusResponse), status
    return {n.node_id for n in status.nodes if n.reachable}


async def reachable_from(address: str) -> set[int]:
    """The same on a fresh connection; nothing while the node does not answer."""
    try:
        (status,) = await exchange(address, [p.ClusterStatus()])
    except (ConnectionError, TimeoutError, asyncio.IncompleteReadError):
        return set()
    assert isinstance(status, p.ClusterStatusResponse), status
    return {n.node_id for n in status.nodes if n.reachable}


# -- the tests ---------------------------------------------------------------------------------


async def test_one_address_past_its_limit_is_refused_and_others_are_served(
    known: Known, client: Client
) -> None:
    nodes = known.cluster.nodes
    surplus = 2 * PER_ADDRESS_MAX + 8
    held: list[Socket] = []
    try:
        for node in nodes:  # every node: whichever leads, the client below meets a full address
            sockets = await open_many(node.client_address, "127.0.0.9", PER_ADDRESS_MAX + surplus)
            held += sockets
            started = time.monotonic()
            closed = await asyncio.gather(*(closed_within(s, CLOSE_S) for s in sockets))
            assert closed.count(False) == PER_ADDRESS_MAX, f"node {node.node_id}: {closed}"
            assert time.monotonic() - started < CLOSE_S + 0.5

        # Another address is served meanwhile, to the end: a produce, and its consumption.
        await Admin(client).create_topic("other-address", 1, 3)
        async with Producer(client) as producer:
            await (await producer.send("other-address", b"served"))
        consumer = Consumer(client)
        await consumer.assign("other-address")

        async def consumed() -> bool:
            return any(r.value == b"served" for r in await consumer.poll(200))

        await apoll_until(consumed, 20.0, "the record produced from another address")

        # Node 1 logged the flood in one line, then one line with the count of the rest: once
        # the interval has passed, on its timer or with the next refusal (the poll below opens
        # one more socket a round). Such a line names one refusal and counts the others.
        node1 = nodes[0]

        async def counted() -> bool:
            held.append(await open_from(node1.client_address, "127.0.0.9"))
            return any("more like it" in line for line in warnings_of(known, 1, PER_ADDRESS_KIND))

        await apoll_until(
            counted, 10 * REFUSAL_LOG_INTERVAL_S, "a counted refusal line", interval_s=0.2
        )
        lines = warnings_of(known, 1, PER_ADDRESS_KIND)
        folded = [int(m[1]) for line in lines if (m := re.search(r"and (\d+) more like it", line))]
        assert 2 <= len(lines) <= 3, lines
        assert folded and 1 + folded[0] >= surplus - 1, lines
        assert "127.0.0.9" in lines[0]
        assert await refused_metric(node1, "connections_per_address_max") >= surplus
    finally:
        close_all(held)
    await assert_intact(known)


async def test_peers_get_through_a_node_full_of_clients(known: Known) -> None:
    node1, node2, node3 = current_cluster(known).nodes
    before = await open_from(node1.client_address, "127.0.0.1")  # before the flood: seated
    # Node 2 goes first, its connections with it, and will dial the full nodes when it is back
    # (a connection it kept open would not show whether a new one gets through).
    flood: list[Socket] = []
    try:
        launcher.kill(node2.pid, wait_s=10.0)
        for node in (node1, node3):
            for source in ("127.0.0.10", "127.0.0.11", "127.0.0.12", "127.0.0.13"):
                flood += await open_many(node.client_address, source, PER_ADDRESS_MAX)
            # Full: an address with no connection open is refused all the same.
            fresh = await open_from(node.client_address, "127.0.0.20")
            flood.append(fresh)
            assert await closed_within(fresh, CLOSE_S), f"node {node.node_id} is not full"
        # Back, node 2 asks its peers' status: it gets through to the full nodes in the slots
        # kept for peers, or it reports them unreachable.
        launcher.restart_node(current_cluster(known), node2.node_id)
        everyone = {node1.node_id, node2.node_id, node3.node_id}

        async def sees_everyone() -> bool:
            seen_by_2 = await reachable_from(node2.client_address)
            return seen_by_2 == everyone and await reachable_peers(before) == everyone

        await apoll_until(
            sees_everyone, RESTART_S, "node 2 to reach the full nodes", interval_s=0.2
        )
        # And keeps reaching them: a poll that failed for longer would go stale.
        until = time.monotonic() + STALE_AFTER_S + 1.0
        while time.monotonic() < until:
            assert await reachable_from(node2.client_address) == everyone
            assert await reachable_peers(before) == everyone
            await asyncio.sleep(0.5)
        assert await refused_metric(node1, "connections_max") >= 1
    finally:
        close_all([before, *flood])
        if not launcher.alive(node2.pid) and not launcher.alive(node_pid(known, node2.node_id)):
            launcher.restart_node(current_cluster(known), node2.node_id)  # failed while down
    await assert_intact(known)


async def test_a_dripping_frame_is_closed_at_its_deadline(known: Known) -> None:
    node = known.cluster.nodes[2]
    reader, writer = await open_from(node.client_address, "127.0.0.30")
    started = time.monotonic()
    closed = False
    try:
        writer.write((1_000).to_bytes(4, "big"))
        # A byte every DRIP_S, never finishing the frame: never idle, and a deadline that each
        # byte restarted would never come.
        while not closed and time.monotonic() - started < FRAME_READ_TIMEOUT_S + SLACK_S:
            writer.write(b"x")
            await writer.drain()
            try:
                closed = await asyncio.wait_for(reader.read(1), DRIP_S) == b""
            except TimeoutError:
                continue
    except ConnectionError:
        closed = True  # reset as we wrote
    finally:
        writer.close()
    elapsed = time.monotonic() - started
    assert closed, f"still open after {elapsed:.1f} s"
    assert elapsed >= FRAME_READ_TIMEOUT_S - 0.05, f"closed after {elapsed:.2f} s"
    lines = warnings_of(known, node.node_id, FRAME_KIND)
    assert lines and "127.0.0.30" in lines[-1], lines
    assert await refused_metric(node, "frame_read_timeout") >= 1
    await assert_intact(known)


@pytest.mark.alone  # its long polls need a steady leader
async def test_a_frame_waiting_on_paused_reading_is_not_timed(known: Known, client: Client) -> None:
    """A client pipelines long polls up to the in-flight bound, then a large frame: the node
    stops reading with part of that frame buffered, for longer than the frame-read deadline.
    That wait is the node's backpressure, not the client's slowness: the connection lives."""
    address = (await leaders(client, KNOWN_TOPIC))[0]  # a long poll waits at the leader only
    end = await Admin(client).list_offsets(KNOWN_TOPIC, 0, Consumer.LATEST)
    long_poll_ms = int(2.5 * FRAME_READ_TIMEOUT_S * 1000)
    at_end = (p.FetchPartition(KNOWN_TOPIC, 0, end, 1_024),)
    polls = [p.Fetch(long_poll_ms, 1_024, at_end, replica_read=False) for _ in range(IN_FLIGHT_MAX)]
    # Larger than a socket read: the node holds its head when it stops reading.
    large = p.Produce(1_000, (p.ProduceEntry("no-such-topic", 0, b"x" * (2 << 20)),))
    started = time.monotonic()
    answers = await exchange(address, [*polls, large])
    elapsed = time.monotonic() - started
    assert elapsed >= long_poll_ms / 1000 - 0.1, f"long polls answered after {elapsed:.1f} s"
    for answer in answers[:-1]:
        assert isinstance(answer, p.FetchResponse), answer
        assert all(not r.batches and not r.error for r in answer.results), answer
    await assert_intact(known)
