"""Consumer groups through the Kafka listener, with Kafka's own clients against a real 3-node
cluster (one per module, its initial rebalance delay cut to 200 ms so that a new group does
not wait 3 s).

Each of confluent-kafka (librdkafka), kafka-python and aiokafka (tests/kafka_group_clients.py):
two members of one group split a topic's partitions and read every record once, each from
its own partitions; a consumer that commits and closes is followed by one that resumes exactly
after the last commit; a member SIGKILLed has its partitions taken over by the other within
its session timeout. Then the coordinator's node is killed while a group commits: no
committed offset is lost, and the group goes on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from cluster.kafka import messages as m
from cluster.local import launcher
from tests.cluster.conftest import running_cluster
from tests.cluster.procs import REPO
from tests.kafka_group_clients import KINDS, SESSION_TIMEOUT_MS, Member, member
from tests.kafka_wire import kafka_call
from tests.polling import poll_until

GROUP_TOML = """
[timing]
group_initial_rebalance_delay_ms = 200
"""
RECORDS = 400
PARTITIONS = 4
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def group_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[launcher.LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("groups"), GROUP_TOML) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def bootstrap(group_cluster: launcher.LocalCluster) -> str:
    return ",".join(group_cluster.kafka_bootstrap)


def new_topic(bootstrap: str, partitions: int = PARTITIONS, records: int = 0) -> str:
    """A new topic holding `records` records, spread over every partition."""
    topic = f"grp-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 3)])[topic].result(TIMEOUT_S)
    produce(bootstrap, topic, records, partitions)
    return topic


def produce(bootstrap: str, topic: str, records: int, partitions: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(records):
        producer.produce(topic, f"v{i}".encode(), partition=i % partitions)
    assert producer.flush(TIMEOUT_S) == 0


def drain(members: list[Member], want: int) -> dict[tuple[int, int], int]:
    """Poll `members` in turn until `want` records are read: which member read each, by
    (partition, offset); a record read twice fails at once."""
    seen: dict[tuple[int, int], int] = {}
    deadline = time.monotonic() + TIMEOUT_S
    while len(seen) < want:
        assert time.monotonic() < deadline, f"{len(seen)} of {want} records read"
        for index, one in enumerate(members):
            for key in one.poll():
                assert key not in seen, f"{key} read twice"
                seen[key] = index
    return seen


def assigned(members: list[Member]) -> list[set[int]]:
    """Each member's partitions, once they split the topic's between them (polling them
    meanwhile). A member may hold every partition for a moment first: the one of a generation
    that the next, the others' join, is about to end."""

    def split() -> bool:
        for one in members:
            assert one.poll() == [], "a record before the topic had any"
        owned = [one.assignment() for one in members]
        return all(owned) and sum(map(len, owned)) == PARTITIONS

    poll_until(split, TIMEOUT_S, "the members splitting the partitions")
    return [one.assignment() for one in members]


@pytest.mark.parametrize("kind", KINDS)
def test_two_members_split_the_partitions_and_read_every_record_once(
    bootstrap: str, kind: str
) -> None:
    topic = new_topic(bootstrap)
    group = f"g-{uuid.uuid4().hex[:6]}"
    members = [member(kind, bootstrap, group), member(kind, bootstrap, group)]
    try:
        for one in members:
            one.subscribe(topic)
        owned = assigned(members)
        assert owned[0] and owned[1] and not owned[0] & owned[1], owned
        assert owned[0] | owned[1] == set(range(PARTITIONS))
        produce(bootstrap, topic, RECORDS, PARTITIONS)
        for (partition, _), reader in drain(members, RECORDS).items():
            assert partition in owned[reader]
    finally:
        for one in members:
            one.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_consumer_resumes_exactly_after_its_groups_last_commit(bootstrap: str, kind: str) -> None:
    topic = new_topic(bootstrap, partitions=1, records=200)
    group = f"g-{uuid.uuid4().hex[:6]}"
    first = member(kind, bootstrap, group)
    first.subscribe(topic)
    drain([first], 120)  # or more: a poll may return many
    first.commit(topic, 0, 120)
    first.close()
    second = member(kind, bootstrap, group)
    try:
        assert second.committed(topic, 0) == 120
        second.subscribe(topic)
        assert sorted(offset for _, offset in drain([second], 80)) == list(range(120, 200))
    finally:
        second.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_killed_members_partitions_move_to_the_survivor_within_its_session_timeout(
    bootstrap: str, kind: str, tmp_path: Path
) -> None:
    topic = new_topic(bootstrap)
    group = f"g-{uuid.uuid4().hex[:6]}"
    ready = tmp_path / "assigned"
    doomed = subprocess.Popen(
        [sys.executable, "-m", "tests.kafka_group_clients", kind, bootstrap, group, topic,
         str(ready)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    survivor = member(kind, bootstrap, group)
    try:
        survivor.subscribe(topic)

        def split() -> bool:
            survivor.poll()
            theirs = ready.read_text() if ready.exists() else ""
            return bool(survivor.assignment()) and bool(theirs)

        poll_until(split, TIMEOUT_S, "the partitions split between the two members")
        killed_at = time.monotonic()
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait()

        def all_mine() -> bool:
            survivor.poll()
            return survivor.assignment() == set(range(PARTITIONS))

        poll_until(all_mine, TIMEOUT_S, "the survivor owning every partition")
        took_s = time.monotonic() - killed_at
        # Its session, then one rebalance (the survivor rejoins at its next heartbeat).
        assert took_s < SESSION_TIMEOUT_MS / 1000 + 5, took_s
    finally:
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait()
        survivor.close()


# -- the coordinator's node killed --------------------------------------------------------------


def current(cluster: launcher.LocalCluster) -> launcher.LocalCluster:
    """The cluster as cluster.json has it now (restarted nodes have new pids)."""
    return launcher.LocalCluster.load(cluster.data_dir) or cluster


def coordinator_of(cluster: launcher.LocalCluster, group: str) -> int:
    """The node id FindCoordinator names for `group`, asking the live nodes in turn."""

    def ask() -> int:
        for node in current(cluster).nodes:
            if not launcher.alive(node.pid):
                continue
            try:
                answer = asyncio.run(
                    kafka_call(
                        node.kafka_address,
                        m.Api.FIND_COORDINATOR,
                        3,
                        m.FindCoordinatorRequest(group),
                    )
                )
            except OSError:
                continue
            assert isinstance(answer, m.FindCoordinatorResponse)
            if answer.error_code == 0:
                return answer.node_id
        return 0

    found = 0

    def known() -> bool:
        nonlocal found
        found = ask()
        return found > 0

    poll_until(known, TIMEOUT_S, f"a coordinator for {group}")
    return found


def test_killing_the_coordinators_node_loses_no_committed_offset(
    group_cluster: launcher.LocalCluster, bootstrap: str
) -> None:
    """Two members consume and commit what they read while the coordinator's node is
    SIGKILLed, twice (restarted in between): every record is read, a commit once acknowledged
    is never lost (OffsetFetch gives it, or a later one, back), and the group goes on."""
    topic = new_topic(bootstrap)
    group = f"g-{uuid.uuid4().hex[:6]}"
    members = [member("confluent-kafka", bootstrap, group) for _ in range(2)]
    read: dict[tuple[int, int], int] = {}
    acked: dict[int, int] = {}  # partition -> the highest commit acknowledged

    def consume(until: int) -> None:
        deadline = time.monotonic() + TIMEOUT_S * 2
        while len(read) < until:
            assert time.monotonic() < deadline, f"{len(read)} of {until} records read"
            for one in members:
                mine: dict[int, int] = {}
                for partition, offset in one.poll():
                    read[(partition, offset)] = read.get((partition, offset), 0) + 1
                    mine[partition] = max(mine.get(partition, -1), offset)
                for partition, offset in mine.items():
                    try:
                        one.commit(topic, partition, offset + 1)
                    except KafkaException:
                        continue  # a coordinator moving, a rebalance: the next one commits
                    acked[partition] = max(acked.get(partition, 0), offset + 1)

    def check_commits() -> None:
        for partition, offset in acked.items():
            found = members[0].committed(topic, partition)
            assert found is not None and found >= offset, (partition, found, offset)

    try:
        for one in members:
            one.subscribe(topic)
        for phase in range(3):
            doomed = coordinator_of(group_cluster, group) if phase else None
            for node in current(group_cluster).nodes:
                if node.node_id == doomed:
                    launcher.kill(node.pid, signal.SIGKILL, wait_s=10)
            produce(bootstrap, topic, RECORDS, PARTITIONS)  # the coordinator's node down
            consume((phase + 1) * RECORDS)
            check_commits()
            if doomed is not None:
                restarted = launcher.restart_node(current(group_cluster), doomed)
                asyncio.run(launcher.wait_ready(restarted, TIMEOUT_S))
        per_partition = 3 * RECORDS // PARTITIONS
        assert set(read) == {(p, o) for p in range(PARTITIONS) for o in range(per_partition)}
        again = sum(n - 1 for n in read.values())
        logging.getLogger(__name__).info("records read again after a failover: %d", again)
        check_commits()
    finally:
        for one in members:
            one.close()
