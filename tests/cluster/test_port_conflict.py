"""A partition group that cannot start on one node (its Raft port is taken) does not take the
node down: the node logs it, keeps serving, and starts the group once the port is free."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from cli import local_cluster
from cluster.client import Admin, Cluster
from tests.cluster.conftest import running_cluster

pytestmark = pytest.mark.asyncio(loop_scope="function")


@pytest.fixture(scope="module")
def fresh_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_cluster.LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("ports")) as cluster:
        yield cluster


async def groups_of(client: Cluster, address: str) -> set[str]:
    return {g.group for g in (await Admin(client).cluster_status(address)).groups}


async def test_a_taken_group_port_is_retried_not_fatal(
    fresh_cluster: local_cluster.LocalCluster,
) -> None:
    node = fresh_cluster.nodes[1]
    first_group_port = node.raft_port + 1  # the first partition ever created gets slot 0
    blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    blocker.bind((node.host, first_group_port))
    blocker.listen()
    client = Cluster(fresh_cluster.bootstrap)
    try:
        await Admin(client).create_topic("conflict", 1, 3)  # the other two replicas lead
        log = fresh_cluster.data_dir / f"node{node.node_id}.log"
        deadline = asyncio.get_running_loop().time() + 30
        while "could not start partition conflict-0" not in log.read_text():
            assert asyncio.get_running_loop().time() < deadline, "the failure was not logged"
            await asyncio.sleep(0.2)
        assert local_cluster.alive(node.pid)
        assert "conflict-0" not in await groups_of(client, node.client_address)
        blocker.close()
        while "conflict-0" not in await groups_of(client, node.client_address):
            assert asyncio.get_running_loop().time() < deadline + 30, "never started"
            await asyncio.sleep(0.2)
    finally:
        blocker.close()
        await client.close()
