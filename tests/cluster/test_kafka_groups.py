"""Consumer groups through the Kafka listener, with Kafka's own clients against a real 3-node
cluster (`group_cluster`: a new group's initial rebalance delay cut to 200 ms, and sessions of
3 s allowed, which members use: a crash is seen in 3 s).

Each of confluent-kafka (librdkafka), kafka-python and aiokafka (tests/kafka_group_clients.py):
two members of one group split a topic's partitions and read every record once, each from
its own partitions; a consumer that commits and closes is followed by one that resumes exactly
after the last commit; a member SIGKILLed has its partitions taken over by the other within
its session timeout (and so does a native `GroupConsumer`'s, over the native protocol). Then
the coordinator's node is killed while a group commits: no committed offset is lost, and the
group goes on.
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from cluster.kafka import codec
from cluster.kafka import messages as m
from cluster.local import launcher
from statemachine.errors import ErrorCode
from tests.cluster.procs import REPO
from tests.kafka_group_clients import KINDS, SESSION_TIMEOUT_MS, Member, member
from tests.kafka_wire import Captured, kafka_call, negotiated, report
from tests.polling import poll_until

RECORDS = 400
PARTITIONS = 4
TIMEOUT_S = 60.0
STATIC_SESSION_MS = 10_000


@pytest.fixture(scope="module")
def bootstrap(group_cluster: launcher.LocalCluster) -> str:
    return ",".join(group_cluster.kafka_bootstrap)


def new_topic(bootstrap: str, partitions: int = PARTITIONS, records: int = 0) -> str:
    """A new topic holding `records` records, spread over every partition, once every node's
    Metadata shows each partition led: a group's leader that assigns a topic its metadata
    does not show yet assigns nothing, and kafka-python looks again only minutes later."""
    topic = f"grp-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 3)])[topic].result(TIMEOUT_S)
    for address in bootstrap.split(","):
        one = AdminClient({"bootstrap.servers": address})

        def led(one: AdminClient = one) -> bool:
            found = one.list_topics(topic, timeout=TIMEOUT_S).topics.get(topic)
            return (
                found is not None
                and found.error is None
                and (
                    len(found.partitions) == partitions
                    and all(p.leader >= 0 for p in found.partitions.values())
                )
            )

        poll_until(led, TIMEOUT_S, f"{topic} led, as {address} tells it")
    produce(bootstrap, topic, records, partitions)
    return topic


def produce(bootstrap: str, topic: str, records: int, partitions: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(records):
        producer.produce(topic, f"v{i}".encode(), partition=i % partitions)
    assert producer.flush(TIMEOUT_S) == 0


def drain(members: Sequence[Member], want: int) -> dict[tuple[int, int], int]:
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


def assigned(members: Sequence[Member]) -> list[set[int]]:
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


# What each client's log shows it sent: the versions README's table gives.
VERSION_PATTERNS = {
    "confluent-kafka": r"Sent (\w+)Request \(v(\d+)",
    "kafka-python": r"Request \d+: (\w+)Request\(version=(\d+)",
    "aiokafka": r"(\w+?)(?:Request|Response)_v(\d+)\(",
}
NEGOTIATED = {
    "confluent-kafka": {"FindCoordinator": [2], "JoinGroup": [5], "SyncGroup": [3],
                        "Heartbeat": [3], "LeaveGroup": [1], "OffsetCommit": [8],
                        "OffsetFetch": [8]},
    "kafka-python": {"FindCoordinator": [6], "JoinGroup": [7], "SyncGroup": [5],
                     "Heartbeat": [4], "LeaveGroup": [5], "OffsetCommit": [8],
                     "OffsetFetch": [8]},
    "aiokafka": {"FindCoordinator": [1], "JoinGroup": [5], "SyncGroup": [3], "Heartbeat": [1],
                 "LeaveGroup": [1], "OffsetCommit": [3], "OffsetFetch": [3]},
}  # fmt: skip
GROUP_APIS = {
    "JoinGroup": m.Api.JOIN_GROUP,
    "SyncGroup": m.Api.SYNC_GROUP,
    "Heartbeat": m.Api.HEARTBEAT,
    "LeaveGroup": m.Api.LEAVE_GROUP,
    "OffsetCommit": m.Api.OFFSET_COMMIT,
    "OffsetFetch": m.Api.OFFSET_FETCH,
}


@pytest.mark.parametrize("kind", KINDS)
def test_a_consumer_resumes_exactly_after_its_groups_last_commit(
    bootstrap: str, kind: str, captured: Captured
) -> None:
    """Also: the group API versions the client sent, read from its log, are those README's
    table gives (a change to our version table that moves a client shows here)."""
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
        poll_until(
            lambda: "Heartbeat" in negotiated(captured.lines, VERSION_PATTERNS[kind]),
            TIMEOUT_S,
            "a heartbeat in the client's log",
        )
    finally:
        second.close()
    versions = {
        name: found
        for name, found in negotiated(captured.lines, VERSION_PATTERNS[kind]).items()
        if name in GROUP_APIS or name == "FindCoordinator"
    }
    report(f"{kind} (groups)", versions)
    for name, api in GROUP_APIS.items():
        served = codec.SUPPORTED[api]
        assert all(served.min_version <= v <= served.max_version for v in versions[name])
    assert {name: sorted(found) for name, found in versions.items()} == NEGOTIATED[kind]


@pytest.mark.alone  # timed against the session timeout
@pytest.mark.parametrize("kind", [*KINDS, "native"])
def test_a_killed_members_partitions_move_to_the_survivor_within_its_session_timeout(
    group_cluster: launcher.LocalCluster, bootstrap: str, kind: str, tmp_path: Path
) -> None:
    topic = new_topic(bootstrap)
    if kind == "native":  # raftbroker's GroupConsumer: the same coordinator, its own protocol
        bootstrap = ",".join(group_cluster.bootstrap)
    group = f"g-{uuid.uuid4().hex[:6]}"
    ready = tmp_path / "assigned"
    doomed = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.kafka_group_clients",
            kind,
            bootstrap,
            group,
            topic,
            str(ready),
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
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
    return cluster.current()


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


# -- the protocol's error paths, at the request level ------------------------------------------


def call(cluster: launcher.LocalCluster, node_id: int, api: m.Api, version: int,
         body: m.RequestBody) -> m.ResponseBody:  # fmt: skip
    node = next(n for n in current(cluster).nodes if n.node_id == node_id)
    return asyncio.run(kafka_call(node.kafka_address, api, version, body))


def join(cluster: launcher.LocalCluster, coordinator: int, group: str, *, version: int = 5,
         member_id: str = "", instance: str | None = None) -> m.JoinGroupResponse:  # fmt: skip
    protocols = (m.JoinGroupRequestProtocol("range", b"sub"),)
    body = m.JoinGroupRequest(
        group, SESSION_TIMEOUT_MS, member_id, "consumer", protocols, 10_000, instance
    )
    answer = call(cluster, coordinator, m.Api.JOIN_GROUP, version, body)
    assert isinstance(answer, m.JoinGroupResponse)
    return answer


def stable_member(cluster: launcher.LocalCluster, coordinator: int, group: str,
                  instance: str | None = None) -> tuple[str, int]:  # fmt: skip
    """A member alone in a new group, synced: its id and generation."""
    first = join(cluster, coordinator, group, instance=instance)
    if first.error_code == ErrorCode.MEMBER_ID_REQUIRED:
        first = join(cluster, coordinator, group, member_id=first.member_id)
    assert first.error_code == 0, first
    sync = m.SyncGroupRequest(
        group,
        first.generation_id,
        first.member_id,
        (m.SyncGroupRequestAssignment(first.member_id, b"all"),),
        instance,
    )
    synced = call(cluster, coordinator, m.Api.SYNC_GROUP, 3, sync)
    assert isinstance(synced, m.SyncGroupResponse) and synced.error_code == 0, synced
    assert synced.assignment == b"all"
    return first.member_id, first.generation_id


def test_a_new_dynamic_member_is_given_its_id_first_from_join_group_v4(
    group_cluster: launcher.LocalCluster,
) -> None:
    group = f"g-{uuid.uuid4().hex[:6]}"
    coordinator = coordinator_of(group_cluster, group)
    required = join(group_cluster, coordinator, group, version=4)
    assert required.error_code == ErrorCode.MEMBER_ID_REQUIRED
    assert required.member_id.startswith("raftbroker-tests-")  # the client id, then a UUID
    joined = join(group_cluster, coordinator, group, version=4, member_id=required.member_id)
    assert (joined.error_code, joined.member_id) == (0, required.member_id)
    older = f"{group}-v3"
    old = join(group_cluster, coordinator_of(group_cluster, older), older, version=3)
    assert old.error_code == 0 and old.member_id


def test_stale_generations_unknown_members_and_other_nodes_are_refused(
    group_cluster: launcher.LocalCluster,
) -> None:
    group = f"g-{uuid.uuid4().hex[:6]}"
    coordinator = coordinator_of(group_cluster, group)
    member_id, generation = stable_member(group_cluster, coordinator, group)

    def heartbeat(node: int, generation: int, member_id: str) -> int:
        answer = call(
            group_cluster,
            node,
            m.Api.HEARTBEAT,
            3,
            m.HeartbeatRequest(group, generation, member_id),
        )
        assert isinstance(answer, m.HeartbeatResponse)
        return answer.error_code

    assert heartbeat(coordinator, generation, member_id) == 0
    assert heartbeat(coordinator, generation - 1, member_id) == ErrorCode.ILLEGAL_GENERATION
    assert heartbeat(coordinator, generation, "nobody") == ErrorCode.UNKNOWN_MEMBER_ID
    other = next(n.node_id for n in current(group_cluster).nodes if n.node_id != coordinator)
    assert heartbeat(other, generation, member_id) == ErrorCode.NOT_COORDINATOR
    topic = new_topic(",".join(group_cluster.kafka_bootstrap), partitions=1)
    commit = m.OffsetCommitRequest(
        group,
        (m.OffsetCommitRequestTopic(topic, (m.OffsetCommitRequestPartition(0, 5),)),),
        generation - 1,
        member_id,
    )
    answer = call(group_cluster, coordinator, m.Api.OFFSET_COMMIT, 7, commit)
    assert isinstance(answer, m.OffsetCommitResponse)
    assert answer.topics[0].partitions[0].error_code == ErrorCode.ILLEGAL_GENERATION


def test_a_static_member_rejoins_without_a_rebalance_and_fences_its_old_id(
    group_cluster: launcher.LocalCluster,
) -> None:
    group = f"g-{uuid.uuid4().hex[:6]}"
    coordinator = coordinator_of(group_cluster, group)
    old_id, generation = stable_member(group_cluster, coordinator, group, instance="static-1")
    again = join(group_cluster, coordinator, group, instance="static-1")  # restarted: no id
    assert again.error_code == 0, again
    assert again.generation_id == generation  # no rebalance
    assert again.member_id != old_id
    sync = m.SyncGroupRequest(group, generation, again.member_id, (), "static-1")
    synced = call(group_cluster, coordinator, m.Api.SYNC_GROUP, 3, sync)
    assert isinstance(synced, m.SyncGroupResponse)
    assert (synced.error_code, synced.assignment) == (0, b"all")  # its assignment, kept
    stale = call(
        group_cluster,
        coordinator,
        m.Api.HEARTBEAT,
        3,
        m.HeartbeatRequest(group, generation, old_id, "static-1"),
    )
    assert isinstance(stale, m.HeartbeatResponse)
    assert stale.error_code == ErrorCode.FENCED_INSTANCE_ID


def generation_now(cluster: launcher.LocalCluster, group: str) -> tuple[str, int]:
    """A dynamic member's id (DescribeGroups) and the group's generation, found as the one its
    Heartbeat is not ILLEGAL_GENERATION for (no API tells a group's generation)."""
    coordinator = coordinator_of(cluster, group)
    described = call(
        cluster, coordinator, m.Api.DESCRIBE_GROUPS, 5, m.DescribeGroupsRequest((group,))
    )
    assert isinstance(described, m.DescribeGroupsResponse)
    (dynamic,) = [x.member_id for x in described.groups[0].members if not x.group_instance_id]
    for generation in range(1, 100):
        beat = call(
            cluster, coordinator, m.Api.HEARTBEAT, 3, m.HeartbeatRequest(group, generation, dynamic)
        )
        assert isinstance(beat, m.HeartbeatResponse)
        if beat.error_code != ErrorCode.ILLEGAL_GENERATION:
            return dynamic, generation
    raise AssertionError("no generation found")


@pytest.mark.parametrize("kind", KINDS)
def test_a_static_member_restarted_takes_its_partitions_back_without_a_rebalance(
    group_cluster: launcher.LocalCluster, bootstrap: str, kind: str
) -> None:
    """KIP-345 with each client: a member with a `group.instance.id` closes (a static member
    does not leave) and a new one with the same instance id joins within the session timeout:
    it gets the same partitions, the other member's never change, and the group's generation
    stays as it was."""
    topic = new_topic(bootstrap)
    group = f"g-{uuid.uuid4().hex[:6]}"
    # A session long enough for a client's restart (kafka-python's takes about 2 s).
    static = member(kind, bootstrap, group, instance="static-a", session_ms=STATIC_SESSION_MS)
    other = member(kind, bootstrap, group, session_ms=STATIC_SESSION_MS)
    try:
        for one in (static, other):
            one.subscribe(topic)
        before = assigned([static, other])
        settled = len(other.history)
        generation = generation_now(group_cluster, group)
        static.close()
        static = member(kind, bootstrap, group, instance="static-a", session_ms=STATIC_SESSION_MS)
        static.subscribe(topic)
        poll_until(lambda: static.assignment() == before[0], TIMEOUT_S, "its partitions back")
        assert other.history[settled - 1 :] == [before[1]], other.history
        assert generation_now(group_cluster, group) == generation  # no rebalance
    finally:
        static.close()
        other.close()


# -- administration through librdkafka's AdminClient ------------------------------------------

ADMIN_APIS = {"ListGroups": [4], "DescribeGroups": [5], "DeleteGroups": [2],
              "OffsetCommit": [8], "OffsetFetch": [8]}  # fmt: skip


def test_librdkafkas_admin_lists_describes_resets_and_deletes_a_group(
    bootstrap: str, captured: Captured
) -> None:
    """What `kafka-consumer-groups` does, through librdkafka's AdminClient: a live group is
    listed and described (its member, host and assignment, decoded by librdkafka), its offsets
    can be neither reset nor deleted; once empty, both work. The admin APIs' versions are read
    from librdkafka's log (README's table)."""
    from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions  # noqa: PLC0415
    from confluent_kafka import TopicPartition as KafkaTopicPartition  # noqa: PLC0415

    topic = new_topic(bootstrap, partitions=2, records=20)
    group = f"adm-{uuid.uuid4().hex[:6]}"
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "debug": "protocol"}
    admin = AdminClient(config | {"logger": logging.getLogger("librdkafka")})
    live = member("confluent-kafka", bootstrap, group)
    try:
        live.subscribe(topic)
        poll_until(lambda: live.assignment() == {0, 1}, TIMEOUT_S, "the member holding both")
        listed = admin.list_consumer_groups().result(TIMEOUT_S)
        [mine] = [g for g in listed.valid if g.group_id == group]
        assert mine.state == ConsumerGroupState.STABLE
        described = admin.describe_consumer_groups([group])[group].result(TIMEOUT_S)
        [one] = described.members
        assert one.host.startswith("/127.") and described.state == ConsumerGroupState.STABLE
        owned = {(tp.topic, tp.partition) for tp in one.assignment.topic_partitions}
        assert owned == {(topic, 0), (topic, 1)}
        reset = [ConsumerGroupTopicPartitions(group, [KafkaTopicPartition(topic, 0, 5)])]
        refused = admin.alter_consumer_group_offsets(reset)[group].result(TIMEOUT_S)
        [error] = [tp.error for tp in refused.topic_partitions]  # per partition, as Kafka's
        assert error is not None and error.code() == KafkaError.UNKNOWN_MEMBER_ID, error
        with pytest.raises(KafkaException, match="NON_EMPTY_GROUP"):
            admin.delete_consumer_groups([group])[group].result(TIMEOUT_S)
    finally:
        live.close()
    done = admin.alter_consumer_group_offsets(reset)[group].result(TIMEOUT_S)
    assert [(tp.partition, tp.offset, tp.error) for tp in done.topic_partitions] == [(0, 5, None)]
    asked = [ConsumerGroupTopicPartitions(group, [KafkaTopicPartition(topic, 0)])]
    fetched = admin.list_consumer_group_offsets(asked)[group].result(TIMEOUT_S)
    assert [tp.offset for tp in fetched.topic_partitions] == [5]
    admin.delete_consumer_groups([group])[group].result(TIMEOUT_S)
    fetched = admin.list_consumer_group_offsets(asked)[group].result(TIMEOUT_S)
    assert [tp.offset for tp in fetched.topic_partitions] == [-1001]  # none: deleted
    admin.poll(0.5)  # its log lines reach the logger from poll
    versions = {
        name: sorted(found)
        for name, found in negotiated(captured.lines, VERSION_PATTERNS["confluent-kafka"]).items()
        if name in ADMIN_APIS
    }
    report("confluent-kafka (group administration)", {k: set(v) for k, v in versions.items()})
    assert versions == ADMIN_APIS
