"""Transactions on a cluster larger than a topic's replication: 4 nodes, 3 replicas a partition,
so a transaction's coordinator hosts no replica of some of its partitions. Only a replica can
propose into a partition's Raft group: the coordinator hands those partitions' registrations
and markers to the node leading them (PartitionTxnEntry, cluster/broker/txns.py), and the
transaction commits and aborts on every partition as on a 3-node cluster. (Broken on purpose,
without that hand-off, the first registration of such a partition is answered
COORDINATOR_NOT_AVAILABLE until the producer gives up.)

Also the request's edge: a PartitionTxnEntry is answered only from a peer's address (a forged
marker could end or fence any transaction: CLUSTER_AUTHORIZATION_FAILED from anyone else, as
Kafka answers a client's inter-broker request); one for a partition the node hosts no replica
of, or for a topic that does not exist, is refused; a marker for a transaction the partition
never had open ends nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from cluster import native as p
from cluster.client import Admin, Client, Connection, TransactionalProducer
from cluster.local import launcher
from statemachine.errors import ErrorCode
from tests.cluster.conftest import wait_ready
from tests.cluster.test_native_transactions import read_values

pytestmark = pytest.mark.asyncio(loop_scope="function")
NODES = 4
PARTITIONS = 4
TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def four_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[launcher.LocalCluster]:
    cluster = launcher.up(tmp_path_factory.mktemp("spread"), NODES)
    try:
        asyncio.run(wait_ready(cluster))
        yield cluster
    finally:
        launcher.down(cluster.current())


@pytest_asyncio.fixture
async def client(four_nodes: launcher.LocalCluster) -> AsyncIterator[Client]:
    client = Client(four_nodes.bootstrap, request_timeout_s=5.0)
    try:
        yield client
    finally:
        await client.close()


async def replicas(client: Client, topic: str) -> dict[int, tuple[int, ...]]:
    answer = await client.call_any(p.Metadata((topic,)))
    assert isinstance(answer, p.MetadataResponse)
    return {m.partition: m.replicas for m in answer.topics[0].partitions}


async def coordinator(client: Client, txn_id: str) -> int:
    answer = await client.call_any(p.FindCoordinator(txn_id, p.TXN_KEY))
    assert isinstance(answer, p.FindCoordinatorResponse)
    assert answer.error == ErrorCode.NONE
    return answer.node_id


async def test_a_transaction_spans_partitions_its_coordinators_node_does_not_host(
    client: Client,
) -> None:
    topic = f"spread-{uuid.uuid4().hex[:8]}"
    await Admin(client).create_topic(topic, PARTITIONS, 3)
    await Admin(client).wait_for_leaders(topic, 30.0)
    txn_id = f"t-{uuid.uuid4().hex[:8]}"
    async with TransactionalProducer(client, txn_id) as producer:
        node = await coordinator(client, txn_id)
        elsewhere = [n for n, nodes in (await replicas(client, topic)).items() if node not in nodes]
        assert elsewhere, "every partition has a replica on the coordinator's node"
        for outcome in ("abort", "commit"):
            producer.begin()
            acks = [
                await producer.send(topic, f"{outcome}{n}".encode(), partition=n)
                for n in range(PARTITIONS)
            ]
            await asyncio.gather(*acks)
            await (producer.commit() if outcome == "commit" else producer.abort())
    committed = await read_values(client, topic, until=PARTITIONS)
    assert sorted(committed) == [f"commit{n}" for n in range(PARTITIONS)]
    everything = await read_values(client, topic, read_committed=False, until=2 * PARTITIONS)
    assert len(everything) == 2 * PARTITIONS


@contextlib.asynccontextmanager
async def connection_to(address: str, local_host: str | None) -> AsyncIterator[Connection]:
    connection = await Connection.open(address, TIMEOUT_S, local_host=local_host)
    try:
        yield connection
    finally:
        await connection.close()


async def entry_answer(
    cluster: launcher.LocalCluster, node_id: int, request: p.PartitionTxnEntry, *, as_peer: bool
) -> int:
    """The answer of node `node_id` to `request`, sent from another node's host (as a peer
    sends it) or from 127.0.0.1 (no node's)."""
    node = next(n for n in cluster.nodes if n.node_id == node_id)
    peer_host = next(n.host for n in cluster.nodes if n.node_id != node_id)
    async with connection_to(node.client_address, peer_host if as_peer else None) as connection:
        answer = await connection.request(request, TIMEOUT_S)
    assert isinstance(answer, p.TxnErrorResponse)
    return answer.error


async def test_a_partition_txn_entry_is_a_peers_and_checked_where_it_lands(
    client: Client, four_nodes: launcher.LocalCluster
) -> None:
    topic = f"edge-{uuid.uuid4().hex[:8]}"
    await Admin(client).create_topic(topic, 1, 3)
    await Admin(client).wait_for_leaders(topic, 30.0)
    hosts = (await replicas(client, topic))[0]
    outside = next(n.node_id for n in four_nodes.nodes if n.node_id not in hosts)
    marker = p.PartitionTxnEntry(topic, 0, 7, 0, 0, 1, 0)
    absent = p.PartitionTxnEntry("absent", 0, 7, 0, 0, 1, 0)
    answers = [
        await entry_answer(four_nodes, hosts[0], marker, as_peer=False),
        await entry_answer(four_nodes, outside, marker, as_peer=True),
        await entry_answer(four_nodes, hosts[0], absent, as_peer=True),
        # A marker for a transaction never opened there: nothing to end (as a replay).
        await entry_answer(four_nodes, hosts[0], marker, as_peer=True),
    ]
    assert answers == [
        ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.NONE,
    ]
