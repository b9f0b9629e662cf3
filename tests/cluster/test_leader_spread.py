"""A new topic's partition leaders spread over the nodes, rather than landing where chance (or
the node that started its groups first) puts them.

Each partition group's first assigned replica (which placement rotates over partitions) stands
for election first when the group is new, the others later (cluster/raft/adapter/:
`PatchedSyncObj._first_election`). A 3-partition topic on 3 nodes, created again and again,
must have its leaders on at least 2 nodes every time, and on all 3 nearly always; left to
chance, one run in several put every leader on one node.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from cluster.client import Admin, Cluster
from cluster.local import launcher
from tests.cluster.conftest import running_cluster

TOPICS = 6
PARTITIONS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[launcher.LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("spread")) as started:
        yield started


async def leaders_of_new_topics(
    cluster: launcher.LocalCluster,
) -> list[tuple[list[int], list[int]]]:
    """(leaders, first assigned replicas) of each new topic, by partition."""
    client = Cluster(cluster.bootstrap, request_timeout_s=5.0)
    found = []
    try:
        for i in range(TOPICS):
            name = f"spread-{i}"
            await Admin(client).create_topic(name, PARTITIONS, 3)
            (topic,) = (await client.refresh([name])).topics
            found.append(
                (
                    [pm.leader_id for pm in topic.partitions],
                    [pm.replicas[0] for pm in topic.partitions],
                )
            )
    finally:
        await client.close()
    return found


def test_a_new_topic_has_its_leaders_on_different_nodes(cluster: launcher.LocalCluster) -> None:
    found = asyncio.run(leaders_of_new_topics(cluster))

    assert all(len(set(leaders)) >= 2 for leaders, _ in found), found
    assert sum(len(set(leaders)) == PARTITIONS for leaders, _ in found) >= TOPICS - 1, found
    assert all(len(set(preferred)) == PARTITIONS for _, preferred in found)  # placement rotates
