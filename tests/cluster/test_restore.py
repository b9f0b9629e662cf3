"""A follower that missed records the leader already compacted away restores them from a peer.

The cluster keeps at most 40 Raft entries per group before compacting. A follower is killed,
hundreds of batches are produced, and the follower restarts: its Raft log is too far behind,
so it installs the leader's snapshot, restarts its local log at the snapshot's end, and fetches
the records below it from a peer replica. Afterwards it alone serves every record from offset 0.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from cluster import native as p
from cluster.client import Admin, Client, ClientError, Producer, ProducerConfig
from cluster.local import launcher
from statemachine.errors import ErrorCode
from statemachine.records import RecordBatch
from tests.cluster.conftest import running_cluster, wait_ready
from tests.polling import apoll_until

pytestmark = pytest.mark.asyncio(loop_scope="function")
TINY_RAFT_LOG = "[limits]\nraft_log_entries_max = 40\n"


@pytest.fixture(scope="module")
def compacting_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[launcher.LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("restore"), TINY_RAFT_LOG) as cluster:
        yield cluster


async def read_replica(client: Client, address: str, topic: str) -> list[bytes] | None:
    """Every value of partition 0 as this one replica holds it, or None while it cannot."""
    values: list[bytes] = []
    offset, high = 0, None
    while high is None or offset < high:
        request = p.Fetch(0, 1 << 20, (p.FetchPartition(topic, 0, offset, 1 << 20),), True)
        try:
            response = await client.send(address, request)
        except ClientError:
            return None  # not listening yet
        assert isinstance(response, p.FetchResponse)
        result = response.results[0]
        if result.error != ErrorCode.NONE:
            return None
        high = result.high_watermark
        for fetched in result.batches:
            batch = RecordBatch.decode(fetched.batch)
            values.extend(r.value or b"" for r in batch.records)
            offset = fetched.base_offset + batch.record_count
        if not result.batches and offset < high:
            return None
    return values


async def test_a_follower_behind_the_compacted_log_restores_every_record(
    compacting_cluster: launcher.LocalCluster,
) -> None:
    client = Client(compacting_cluster.bootstrap)
    try:
        await Admin(client).create_topic("restore", 1, 3)
        meta = await client.refresh(["restore"])
        leader_id = meta.topics[0].partitions[0].leader_id
        follower = next(n for n in compacting_cluster.nodes if n.node_id != leader_id)
        launcher.kill(follower.pid, signal.SIGKILL)

        sent = [f"r{i}".encode() for i in range(600)]
        config = ProducerConfig(batch_size_bytes=100, linger_ms=0)
        async with Producer(client, config) as producer:
            for value in sent:  # one small batch at a time: hundreds of Raft entries
                await (await producer.send("restore", value))
        launcher.restart_node(compacting_cluster, follower.node_id)

        async def restored() -> bool:
            return await read_replica(client, follower.client_address, "restore") == sent

        await apoll_until(restored, 60, "the follower to hold every record", interval_s=0.2)
        log = (compacting_cluster.data_dir / f"node{follower.node_id}.log").read_text()
        assert "restoring offsets 0.." in log  # the snapshot path really ran
        assert "restored offsets" in log
        await wait_ready(compacting_cluster.current())
    finally:
        await client.close()
