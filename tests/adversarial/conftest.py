"""The adversarial suite's cluster and its one verdict: a hostile request changed nothing.

A module's tests share one real 3-node cluster of `raftbroker node` processes on loopback,
holding a known set of records (topic `known`, 3 partitions). Each test attacks it through
real sockets, then calls `assert_intact`, which holds only if

- every node process is alive and its RSS is within `RSS_BOUND_BYTES`;
- every node answers ClusterStatus and sees every Raft group with a leader, and healthy;
- the known records are all consumable, each exactly once, and nothing else is in `known`;
- no node's log holds a traceback (a refused request is logged in one line, if at all).

Raw-socket helpers speak the native framing (a 4-byte big-endian length, then the payload) so
tests can send what no client would; `exchange` pipelines requests built with the protocol's own
encoder (valid but hostile) on one connection and reads their answers, refusing an answer frame
larger than a client would accept.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import Counter, deque
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from cluster import native as p
from cluster.client import Admin, Client, Consumer, Producer
from cluster.config import Limits
from cluster.local import launcher
from tests.cluster.conftest import running_cluster
from tests.polling import apoll_until

KNOWN_TOPIC = "known"
KNOWN_PARTITIONS = 3
KNOWN_RECORDS = 300
# A node holding this suite's cluster idles at ~80 MB; an attack that makes it buffer a
# response or a flood of connections shows far above this.
RSS_BOUND_BYTES = 400 * 1024 * 1024
CONSUME_TIMEOUT_S = 30.0
SOCKET_TIMEOUT_S = 10.0
# The largest answer frame a client accepts.
ANSWER_FRAME_BYTES_MAX = Limits().frame_bytes_max
RSS_SETTLE_SAMPLES = 10
RSS_SAMPLE_INTERVAL_S = 0.1
RSS_SETTLED_BYTES = 1024 * 1024
RSS_SETTLE_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Known:
    """The cluster under attack and the records it must keep."""

    cluster: launcher.LocalCluster
    values: tuple[bytes, ...]


def known_value(index: int) -> bytes:
    return b"known-%05d" % index


@contextlib.contextmanager
def known_cluster(data_dir: Path, extra_toml: str = "") -> Iterator[Known]:
    """A running cluster in `data_dir` (its nodes configured with `extra_toml`) holding the
    known records; stopped after."""
    with running_cluster(data_dir, extra_toml) as cluster:
        values = tuple(known_value(i) for i in range(KNOWN_RECORDS))
        asyncio.run(_produce_known(cluster, values))
        yield Known(cluster, values)


@pytest.fixture(scope="module")
def known_toml() -> str:
    """Extra node configuration for the module's cluster (none); a module overrides this
    fixture to tune a setting its attack needs to see in seconds (small limits, short
    deadlines)."""
    return ""


@pytest.fixture(scope="module")
def known(tmp_path_factory: pytest.TempPathFactory, known_toml: str) -> Iterator[Known]:
    with known_cluster(tmp_path_factory.mktemp("adversarial"), known_toml) as cluster:
        yield cluster


async def _produce_known(cluster: launcher.LocalCluster, values: tuple[bytes, ...]) -> None:
    client = Client(cluster.bootstrap, request_timeout_s=10.0)
    try:
        await Admin(client).create_topic(KNOWN_TOPIC, KNOWN_PARTITIONS, 3)
        async with Producer(client) as producer:
            acks = [await producer.send(KNOWN_TOPIC, value) for value in values]
            await asyncio.gather(*acks)
    finally:
        await client.close()


@pytest_asyncio.fixture
async def client(known: Known) -> AsyncIterator[Client]:
    c = Client(known.cluster.bootstrap, request_timeout_s=5.0)
    try:
        yield c
    finally:
        await c.close()


# -- the verdict -----------------------------------------------------------------------------


async def assert_intact(known: Known) -> None:
    """Fail unless the cluster is whole and holds exactly the known records (see module doc)."""
    current = known.cluster.current()
    for node in current.nodes:
        assert launcher.alive(node.pid), f"node {node.node_id} (pid {node.pid}) died"
        rss = rss_bytes(node.pid)
        assert rss <= RSS_BOUND_BYTES, f"node {node.node_id} holds {rss >> 20} MiB"
    client = Client(current.bootstrap, request_timeout_s=5.0)
    try:
        await apoll_until(
            lambda: _every_group_led_and_healthy(client, current),
            30.0,
            "every group of every node led and healthy",
        )
        consumed = await _consume_known(client)
    finally:
        await client.close()
    counts = Counter(consumed)
    assert set(counts) == set(known.values), "known records lost, or others added"
    assert max(counts.values()) == 1, "known records duplicated"
    for node in current.nodes:
        log = (current.data_dir / f"node{node.node_id}.log").read_text(errors="replace")
        assert "Traceback" not in log, f"node {node.node_id} logged a traceback"


async def _every_group_led_and_healthy(client: Client, cluster: launcher.LocalCluster) -> bool:
    admin = Admin(client)
    for node in cluster.nodes:
        try:
            status = await admin.cluster_status(node.client_address)
        except Exception:  # noqa: BLE001 - any failure to answer counts as not yet
            return False
        if not status.groups or any(g.leader_id < 0 or not g.healthy for g in status.groups):
            return False
    return True


async def _consume_known(client: Client) -> list[bytes]:
    return await consume_all(client, KNOWN_TOPIC, KNOWN_PARTITIONS)


async def consume_all(client: Client, topic: str, partitions: int) -> list[bytes]:
    """Every value of `topic`'s partitions, from the start to their ends as of the call."""
    consumer = Consumer(client)
    await consumer.assign(topic)
    admin = Admin(client)
    ends = {n: await admin.list_offsets(topic, n, Consumer.LATEST) for n in range(partitions)}
    values: list[bytes] = []
    next_offsets = dict.fromkeys(ends, 0)

    async def all_read() -> bool:
        for record in await consumer.poll(200):
            next_offsets[record.partition] = record.offset + 1
            values.append(record.value or b"")
        return all(next_offsets[n] >= end for n, end in ends.items())

    await apoll_until(all_read, CONSUME_TIMEOUT_S, f"every record of {topic} read")
    return values


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc."""
    return _proc_status_bytes(pid, "VmRSS")


def peak_rss_bytes(pid: int) -> int:
    """The largest resident set size a process has had (its high-water mark), from /proc."""
    return _proc_status_bytes(pid, "VmHWM")


def _proc_status_bytes(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} for pid {pid}")


# -- raw sockets -------------------------------------------------------------------------------


def frame(payload: bytes) -> bytes:
    """The native framing: a 4-byte big-endian length, then the payload."""
    return len(payload).to_bytes(4, "big") + payload


async def open_raw(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, _, port = address.rpartition(":")
    async with asyncio.timeout(SOCKET_TIMEOUT_S):
        return await asyncio.open_connection(host, int(port))


async def send_and_drain(address: str, data: bytes) -> bytes:
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


async def read_answer(
    reader: asyncio.StreamReader,
    request_type: type[p.Request],
    frame_bytes_max: int = ANSWER_FRAME_BYTES_MAX,
) -> tuple[int, p.Response | p.ErrorResponse]:
    """The next answer on a raw connection; ProtocolError if its frame exceeds the bound (its
    body is never read: a node that builds an answer no client would take fails right there)."""
    async with asyncio.timeout(SOCKET_TIMEOUT_S):
        body = await p.read_frame(reader, frame_bytes_max)
    return p.decode_response(body, request_type)


async def exchange(
    address: str, requests: Sequence[p.Request]
) -> list[p.Response | p.ErrorResponse]:
    """Send `requests` pipelined in one write on a fresh connection (correlation ids 1, 2, ...)
    and read their answers, which must come in the same order."""
    reader, writer = await open_raw(address)
    try:
        writer.write(b"".join(p.encode_request(i, r) for i, r in enumerate(requests, 1)))
        await writer.drain()
        answers = []
        for i, request in enumerate(requests, 1):
            correlation_id, answer = await read_answer(reader, type(request))
            assert correlation_id == i, f"answer {correlation_id} came in place of {i}"
            answers.append(answer)
        return answers
    finally:
        writer.close()


async def leaders(client: Client, topic: str) -> dict[int, str]:
    """The client address of each partition's leader, as a fresh metadata answer names them."""
    response = await client.refresh([topic])
    brokers = {b.node_id: b.address for b in response.brokers}
    (meta,) = response.topics
    return {pm.partition: brokers[pm.leader_id] for pm in meta.partitions if pm.leader_id >= 0}


def node_pid(known: Known, node_id: int) -> int:
    current = known.cluster.current()
    return next(n.pid for n in current.nodes if n.node_id == node_id)


def pid_at(known: Known, client_address: str) -> int:
    """The pid of the node serving clients at `client_address`."""
    current = known.cluster.current()
    return next(n.pid for n in current.nodes if n.client_address == client_address)


async def settled_rss_bytes(pid: int) -> int:
    """A process's RSS once it has stopped changing: within `RSS_SETTLED_BYTES` over
    `RSS_SETTLE_SAMPLES` samples `RSS_SAMPLE_INTERVAL_S` apart (work it was given is done)."""
    samples: deque[int] = deque(maxlen=RSS_SETTLE_SAMPLES)

    def settled() -> int | None:
        samples.append(rss_bytes(pid))
        if len(samples) < RSS_SETTLE_SAMPLES or max(samples) - min(samples) > RSS_SETTLED_BYTES:
            return None
        return samples[-1]

    return await apoll_until(
        settled,
        RSS_SETTLE_TIMEOUT_S,
        f"pid {pid}'s RSS to settle",
        interval_s=RSS_SAMPLE_INTERVAL_S,
    )


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# -- the HTTP port and the data directory (issue 19, defects 8 and 9) -------------------------


async def http_open(
    node: launcher.NodeProcess,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await open_raw(f"{node.host}:{node.http_port}")


async def http_exchange(node: launcher.NodeProcess, request: bytes) -> bytes:
    """Send `request` to the node's HTTP port; everything it answers until it closes."""
    reader, writer = await http_open(node)
    try:
        with contextlib.suppress(ConnectionError):
            writer.write(request)
            await writer.drain()
        received = b""
        async with asyncio.timeout(SOCKET_TIMEOUT_S):
            with contextlib.suppress(ConnectionError):
                while chunk := await reader.read(65_536):
                    received += chunk
        return received
    finally:
        writer.close()


def current_cluster(known: Known) -> launcher.LocalCluster:
    """The module's cluster as last recorded (its pids change when a test restarts nodes)."""
    return known.cluster.current()


def partition_dirs(cluster: launcher.LocalCluster) -> list[Path]:
    """Every partition replica's directory, on every node."""
    return sorted(
        d
        for node in cluster.nodes
        for d in (cluster.data_dir / f"node{node.node_id}" / "partitions").iterdir()
    )


def topic_of_dir(directory: Path) -> str | None:
    """The topic a partition directory belongs to, as its `topic` file says; None while the
    directory is being removed (its label may go before it does)."""
    try:
        return (directory / "topic").read_text().removesuffix("\n")
    except FileNotFoundError:
        return None
