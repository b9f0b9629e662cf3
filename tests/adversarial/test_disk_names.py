"""On-disk names: a valid topic always fits the file system, and old data directories still open.

Issue 19, defect 8: a partition's directory was `partitions/<topic>-<partition>.<topic id>/`,
so a valid 249-character name with 12 partitions, once topic ids reached three digits, made a
name over 255 bytes (ENAMETOOLONG): partitions 10 and 11 never got a leader, and a traceback
was logged every 5 s. Directories are now `partitions/<topic id>-<partition>/`, the topic's
name kept in a `topic` file inside. (The old name was never in a release: no rename of it.)
"""

from __future__ import annotations

import asyncio
import os

import pytest

from cluster import native as p
from cluster.client import Admin, Client, Consumer, Producer, retrying
from tests.adversarial.conftest import (
    Known,
    assert_intact,
    current_cluster,
    http_exchange,
    partition_dirs,
    topic_of_dir,
)
from tests.polling import apoll_until

pytestmark = pytest.mark.asyncio(loop_scope="function")

NAME_BYTES_MAX = os.pathconf("/", "PC_NAME_MAX")  # 255 on every file system we run on
LONG_TOPIC = "L" * 249  # the longest valid name
LONG_PARTITIONS = 12
THREE_DIGITS = 100


async def _push_topic_ids_to(client: Client, wanted: int) -> int:
    """Create and delete a throwaway topic until the next topic id is at least `wanted`, once
    at least; the last id it took."""
    topic_id = -1
    while topic_id < 0 or topic_id + 1 < wanted:
        created = await retrying(lambda: client.send_any(p.CreateTopic("filler", 1, 1, -1, -1)), 30)
        assert isinstance(created, p.CreateTopicResponse)
        topic_id = created.topic_id
        await retrying(lambda: client.send_any(p.DeleteTopic("filler")), 30)
    return topic_id


async def test_the_longest_name_with_a_three_digit_id_gets_every_partition(known: Known) -> None:
    client = Client(known.cluster.bootstrap, request_timeout_s=5.0)
    try:
        await _push_topic_ids_to(client, THREE_DIGITS)
        admin = Admin(client)
        topic_id = await admin.create_topic(LONG_TOPIC, LONG_PARTITIONS, 3, timeout_s=30.0)
        assert topic_id >= THREE_DIGITS
        # The name the old layout would have given partition 11: past what a file name holds.
        assert len(f"{LONG_TOPIC}-11.{topic_id}") > NAME_BYTES_MAX
        async with Producer(client) as producer:
            acks = [
                await producer.send(LONG_TOPIC, b"v%d" % i, partition=i)
                for i in range(LONG_PARTITIONS)
            ]
            offsets = [(ack.partition, ack.offset) for ack in await asyncio.gather(*acks)]
        assert offsets == [(i, 0) for i in range(LONG_PARTITIONS)]
        consumer = Consumer(client)
        await consumer.assign(LONG_TOPIC)
        seen: dict[int, bytes | None] = {}

        async def all_read() -> bool:
            seen.update((r.partition, r.value) for r in await consumer.poll(200))
            return len(seen) == LONG_PARTITIONS

        await apoll_until(all_read, 30.0, "a record from every partition of the long topic")
        assert seen == {i: b"v%d" % i for i in range(LONG_PARTITIONS)}
        # Each node hosts a replica of every partition, and names its group in ClusterStatus.
        for node in current_cluster(known).nodes:
            status = await admin.cluster_status(node.client_address)
            groups = {g.group: g for g in status.groups if g.group.startswith(LONG_TOPIC)}
            assert sorted(groups) == sorted(f"{LONG_TOPIC}-{i}" for i in range(LONG_PARTITIONS))
            assert all(g.healthy and g.leader_id >= 0 for g in groups.values())
        # Every replica's directory is named by id and partition and says whose it is.
        for directory in partition_dirs(current_cluster(known)):
            assert len(directory.name) <= NAME_BYTES_MAX
        held = [d for d in partition_dirs(current_cluster(known)) if topic_of_dir(d) == LONG_TOPIC]
        assert sorted(d.name for d in held) == sorted(
            f"{topic_id}-{i}" for i in range(LONG_PARTITIONS) for _ in range(3)
        )
        await admin.delete_topic(LONG_TOPIC)

        def gone() -> bool:
            # A directory without its label is one being removed: not gone yet.
            return not any(
                topic_of_dir(d) in (LONG_TOPIC, None)
                for d in partition_dirs(current_cluster(known))
            )

        await apoll_until(gone, 30.0, "every replica of the deleted long topic removed")
    finally:
        await client.close()
    await assert_intact(known)


async def test_a_partition_that_cannot_start_is_reported_once_and_retried(known: Known) -> None:
    cluster = current_cluster(known)
    node = cluster.nodes[0]
    client = Client(cluster.bootstrap, request_timeout_s=5.0)
    try:
        next_id = await _push_topic_ids_to(client, 0) + 1
        # A file where node 1 would make the directory of partition 0: its start fails.
        blocker = cluster.data_dir / f"node{node.node_id}" / "partitions" / f"{next_id}-0"
        blocker.write_text("in the way\n")
        admin = Admin(client)
        assert await admin.create_topic("blocked", 1, 3, timeout_s=30.0) == next_id

        async def reported() -> p.RaftGroupReport | None:
            status = await admin.cluster_status(node.client_address)
            group = next((g for g in status.groups if g.group == "blocked-0"), None)
            return group if group is not None and not group.healthy else None

        group = await apoll_until(reported, 30.0, "node 1 reporting blocked-0 unhealthy")
        assert group.leader_id == -1
        assert group.detail.startswith("not started: FileExistsError"), group.detail
        health = await http_exchange(node, b"GET /healthz HTTP/1.1\r\n\r\n")
        assert health.startswith(b"HTTP/1.1 503 ") and b"blocked-0: not started" in health
        blocker.unlink()

        async def started() -> bool:
            status = await admin.cluster_status(node.client_address)
            group = next((g for g in status.groups if g.group == "blocked-0"), None)
            return group is not None and group.healthy and group.leader_id >= 0

        await apoll_until(started, 30.0, "node 1 starting blocked-0 once unblocked")
        await admin.delete_topic("blocked")
    finally:
        await client.close()
    log = (cluster.data_dir / f"node{node.node_id}.log").read_text()
    assert log.count("could not start partition blocked-0") == 1, "not one clear line"
    await assert_intact(known)
