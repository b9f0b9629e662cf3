"""A new topic's partition leaders spread over the nodes, rather than landing where chance (or
the node that started its groups first) puts them.

Each partition group's first assigned replica (which placement rotates over partitions) stands
for election first when the group is new, the others later (cluster/raft/adapter/:
`PatchedSyncObj._first_election`). A 3-partition topic on 3 nodes, created again and again,
must have every partition led by its preferred replica, so its leaders on all 3 nodes; left to
chance, one run in several put every leader on one node.

The check is exact, not statistical: this cluster's election timeouts are wide (1.5-3 s), so
the preferred replica stands 0.75 s after its group starts and any other 4.5 s or more after,
a lead no stall of a loaded test machine eats (with the defaults, 0.25 s against 1.5 s).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from cluster.client import Admin, Client
from cluster.local import launcher
from tests.cluster.conftest import running_cluster

TOPICS = 6
PARTITIONS = 3
WIDE_ELECTION_TIMEOUTS = """
[timing]
election_timeout_ms_min = 1500
election_timeout_ms_max = 3000
connection_timeout_ms = 3000
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[launcher.LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("spread"), WIDE_ELECTION_TIMEOUTS) as started:
        yield started


async def leaders_of_new_topics(
    cluster: launcher.LocalCluster,
) -> list[tuple[list[int], list[int]]]:
    """(leaders, first assigned replicas) of each new topic, by partition."""
    client = Client(cluster.bootstrap, request_timeout_s=5.0)
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

    assert all(len(set(preferred)) == PARTITIONS for _, preferred in found)  # placement rotates
    assert [leaders for leaders, _ in found] == [preferred for _, preferred in found]
