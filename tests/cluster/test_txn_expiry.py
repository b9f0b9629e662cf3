"""Transactional-id expiry on a cluster configured with a 2 s expiration interval.

The leader stamps `ExpireTransactionalIds` entries; every replica removes the idle id at the same
index, and InitProducerId for it then allocates a new producer id.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli import local_cluster
from cluster import protocol as p
from cluster.client import Admin, Cluster
from tests.cluster.conftest import wait_ready

pytestmark = pytest.mark.asyncio(loop_scope="function")
FAST_EXPIRY = "[timing]\ntransactional_id_expiration_ms = 2000\nexpiry_tick_interval_ms = 200\n"


@pytest.fixture(scope="module")
def expiring_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[local_cluster.LocalCluster]:
    data_dir: Path = tmp_path_factory.mktemp("expiry")
    cluster = local_cluster.up(data_dir, 3, extra_toml=FAST_EXPIRY)
    try:
        asyncio.run(wait_ready(cluster))
        yield cluster
    finally:
        local_cluster.down(local_cluster.LocalCluster.load(data_dir) or cluster)


async def replicas_converge(client: Cluster, addresses: list[str], timeout_s: float = 10) -> None:
    """Every metadata replica reaches the same applied index (so the same state)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        statuses = [await Admin(client).cluster_status(a) for a in addresses]
        applied = {
            next(g.last_applied for g in s.groups if g.group == "__metadata") for s in statuses
        }
        if len(applied) == 1:
            return
        assert asyncio.get_running_loop().time() < deadline, f"replicas at {applied}"
        await asyncio.sleep(0.05)


async def test_idle_transactional_id_expires_on_every_replica(
    expiring_cluster: local_cluster.LocalCluster,
) -> None:
    client = Cluster(expiring_cluster.bootstrap)
    try:
        first = await client.send_any(p.InitProducerId("nightly-job", 60_000, -1, -1))
        assert isinstance(first, p.InitProducerIdResponse)
        again = await client.send_any(p.InitProducerId("nightly-job", 60_000, -1, -1))
        assert isinstance(again, p.InitProducerIdResponse)
        assert (again.producer_id, again.epoch) == (first.producer_id, 1)  # not expired yet

        # Time passing is what is under test (any call for the id would refresh it): wait out
        # the 2 s interval with room for the 200 ms expiry ticks.
        await asyncio.sleep(3.0)
        fresh = await client.send_any(p.InitProducerId("nightly-job", 60_000, -1, -1))
        assert isinstance(fresh, p.InitProducerIdResponse)
        assert fresh.producer_id != first.producer_id
        assert fresh.epoch == 0
        await replicas_converge(client, expiring_cluster.bootstrap)
    finally:
        await client.close()
