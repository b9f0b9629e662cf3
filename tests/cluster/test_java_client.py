"""Kafka's reference Java client (kafka-clients 4.x) against the Kafka listener.

The strictest Kafka client there is: it validates what it negotiates and what it is sent. Its
idempotent producer rides out a SIGKILL of the partition leader (every record once, in the
order sent); a consumer group of two members with commits loses nothing when one of them is
killed; transactions commit and abort, read_committed reading only the committed ones, and
offsets sent to a transaction commit or drop with it; the AdminClient creates, describes and
deletes topics, describes the cluster, lists and describes groups and lists offsets. The API
versions it was offered are read from its log (`NetworkClient` at DEBUG): exactly what the
listener serves, and of each it uses our newest (README's table: the Java client's column is
each API's newest version).

One JVM per client (`tests.kafka_java`), started from `java/ClientDriver.java`; the module is
skipped with the reason where Java or Maven is missing (required in CI).
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from cluster.kafka.codec.headers import SUPPORTED
from cluster.local import launcher
from tests.cluster.procs import partition_leader, restore
from tests.cluster.test_kafka_admin import committed
from tests.kafka_java import REPO, Event, JavaClient, JavaClients, java_clients
from tests.polling import poll_until

RECORDS = 1_000
PACE_MS = 2  # about 2 s of sending: the kill, after the first 100 acks, falls inside it
GROUP_RECORDS = 200  # per partition
# NetworkClient's DEBUG line on each node's ApiVersions answer: "API versions: (Produce(0): 3
# to 12 [usable: 12], ..., SaslHandshake(17): UNSUPPORTED, ..., DescribeProducers(61): 0
# [usable: 0], ...)".
OFFERED = re.compile(r"\w+\((\d+)\): (\d+)(?: to (\d+))? \[usable: (\d+)\]")


@pytest.fixture(scope="module")
def java(group_cluster: launcher.LocalCluster) -> Iterator[JavaClients]:
    assert group_cluster.kafka_bootstrap
    yield from java_clients(group_cluster.kafka_bootstrap)


def test_the_idempotent_producer_rides_out_a_leader_kill_every_record_once_in_order(
    group_cluster: launcher.LocalCluster, java: JavaClients
) -> None:
    client = java.start()
    client.call({"op": "admin", "action": "create_topic", "topic": "java-kill", "partitions": 1})
    leader = asyncio.run(partition_leader(group_cluster.bootstrap, "java-kill", 0))
    killed: list[int] = []

    def on_event(event: Event) -> None:
        if event["event"] == "acked" and not killed:  # the first hundred are in: kill now
            node = next(n for n in group_cluster.current().nodes if n.node_id == leader)
            launcher.kill(node.pid, signal.SIGKILL, wait_s=10)
            killed.append(node.node_id)

    try:
        request = {"op": "produce", "topic": "java-kill", "count": RECORDS, "prefix": "k"}
        answer = client.call({**request, "pace_ms": PACE_MS}, on_event)
    finally:
        restore(group_cluster)
    assert killed == [leader]
    assert answer["errors"] == [] and answer["acked"] == RECORDS, answer
    assert answer["offsets"] == [0, RECORDS - 1], answer
    read = client.call({"op": "consume", "topic": "java-kill", "count": RECORDS + 1,
                        "group": None, "timeout_ms": 5_000})  # fmt: skip
    assert read["values"] == [f"k-{i}" for i in range(RECORDS)]
    check_positions_by_epoch(client, read["epochs"])


def test_transactions_commit_and_abort_and_read_committed_sees_only_commits(
    java: JavaClients,
) -> None:
    """Kafka's Java client, the strictest: a transactional producer commits, aborts and
    commits again over three partitions; its read_committed consumer reads exactly the two
    committed transactions (the aborted one's records and every marker skipped), and a
    read_uncommitted one the aborted records too."""
    client = java.start()
    client.call({"op": "admin", "action": "create_topic", "topic": "java-txn", "partitions": 3})
    outcomes = [True, False, True]
    ended = client.call({"op": "transactions", "topic": "java-txn", "partitions": 3,
                         "txn_id": "jt", "outcomes": outcomes})  # fmt: skip
    assert ended == {"ended": 3}
    committed = {f"jt-{i}-{p}" for i in (0, 2) for p in range(3)}
    aborted = {f"jt-1-{p}" for p in range(3)}

    def read(isolation: str, count: int) -> list[str]:
        asked = {"op": "consume", "topic": "java-txn", "count": count + 1, "group": None}
        answer = client.call({**asked, "timeout_ms": 5_000, "isolation": isolation})
        return sorted(answer["values"])

    assert read("read_committed", len(committed)) == sorted(committed)
    assert read("read_uncommitted", len(committed | aborted)) == sorted(committed | aborted)


def check_positions_by_epoch(client: JavaClient, epochs: list[int]) -> None:
    """The records of the kill's two leaders carry two leader epochs; a position read in the
    first is validated by the client with OffsetForLeaderEpoch (KIP-320) before it fetches:
    one at the first epoch's end holds, one past it is the log truncation the client reports
    (auto.offset.reset=none), at the offset and epoch the listener answered."""
    first = epochs[0]
    boundary = next((i for i, e in enumerate(epochs) if e != first), None)
    assert boundary is not None and first >= 0 and epochs[boundary] > first, epochs
    assert epochs == sorted(epochs), "epochs never go back"

    def seek(offset: int) -> dict[str, Any]:
        request = {"op": "seek", "topic": "java-kill", "partition": 0, "offset": offset,
                   "epoch": first, "count": 5, "timeout_ms": 10_000}  # fmt: skip
        return client.call(request)

    held = seek(boundary)
    assert held["values"][:5] == [f"k-{i}" for i in range(boundary, boundary + 5)], held
    diverged = seek(boundary + 10)
    assert diverged.get("truncated") == {"offset": boundary, "epoch": first}, diverged


def test_a_group_of_two_loses_nothing_when_a_member_is_killed(
    group_cluster: launcher.LocalCluster, java: JavaClients
) -> None:
    """Two members share 4 partitions (the client's default assignors: range first) and
    commit what they read; one is SIGKILLed (no LeaveGroup: its session must expire) and the
    survivor reads on from the killed one's last commits."""
    admin = java.start()
    topic, group = "java-group", "java-members"
    admin.call({"op": "admin", "action": "create_topic", "topic": topic, "partitions": 4})
    first, second = java.start(), java.start()
    seen: dict[JavaClient, list[Event]] = {first: [], second: []}
    for member in (first, second):
        member.send({"op": "member", "topic": topic, "group": group})

    def split() -> bool:
        described = admin.call({"op": "admin", "action": "describe_group", "group": group})
        return described["members"] == 2 and len(described["assigned"]) == 4

    poll_until(split, 60, "two members sharing the 4 partitions")
    produce_each(admin, topic, "a")

    def both_read() -> bool:
        for member, events in seen.items():
            drain(member, events)
        return all(seen.values())

    poll_until(both_read, 60, "both members reading")
    first.kill()
    drain_to_end(first, seen[first])  # what it printed before it died (all it committed)
    produce_each(admin, topic, "b")
    expected = {f"{prefix}-{p}-{i}" for prefix in "ab" for p in range(4)
                for i in range(GROUP_RECORDS)}  # fmt: skip

    def survivor_read_the_rest() -> bool:
        drain(second, seen[second])
        return {e["value"] for events in seen.values() for e in events} >= expected

    poll_until(survivor_read_the_rest, 60, "the survivor reading the killed member's partitions")
    described = admin.call({"op": "admin", "action": "describe_group", "group": group})
    assert described["members"] == 1 and len(described["assigned"]) == 4, described
    assert sorted(described["committed"].values()) == [2 * GROUP_RECORDS] * 4, described
    read_by = Counter(e["value"] for events in seen.values() for e in events)
    assert set(read_by) == expected  # nothing else; a record read twice is at-least-once
    assert group in admin.call({"op": "admin", "action": "list_groups"})["groups"]
    second.send({"op": "stop"})


def produce_each(client: JavaClient, topic: str, prefix: str) -> None:
    for partition in range(4):
        request = {"op": "produce", "topic": topic, "partition": partition,
                   "count": GROUP_RECORDS, "prefix": f"{prefix}-{partition}"}  # fmt: skip
        answer = client.call(request)
        assert answer["errors"] == [] and answer["acked"] == GROUP_RECORDS, answer


def drain_to_end(member: JavaClient, events: list[Event]) -> None:
    """Every record event a dead member printed, into `events`."""
    while (line := member.lines.get(timeout=10)) is not None:
        event = json.loads(line)
        assert event.get("event") == "record", event
        events.append(event)


def drain(member: JavaClient, events: list[Event]) -> None:
    """The record events the member has sent so far, into `events`."""
    while not member.lines.empty():
        event = member.next_line(1.0)
        assert event.get("event") == "record", event
        events.append(event)


def test_the_admin_client_manages_topics_and_reads_the_cluster(
    group_cluster: launcher.LocalCluster, java: JavaClients
) -> None:
    admin = java.start()

    def call(**request: Any) -> Event:
        return admin.call({"op": "admin", **request})

    def ask(**request: Any) -> Event:
        """An admin call whose answer may be an error (a node that has not yet applied a
        metadata change answers UnknownTopicOrPartition)."""
        admin.send({"op": "admin", **request})
        return admin.answer()

    call(action="create_topic", topic="java-admin", partitions=3)

    def led() -> Event | None:
        # As with Kafka, a topic is created before its partitions are led and their replicas
        # in sync (its AdminClient's documentation: it may take a while).
        described = ask(action="describe_topic", topic="java-admin")
        if "error" in described:
            assert "UnknownTopicOrPartition" in described.get("cause", ""), described
            return None
        parts = described["partitions"]
        return described if all(p["leader"] > 0 and len(p["isr"]) == 3 for p in parts) else None

    described = poll_until(led, 30, "java-admin's partitions led, every replica in sync")
    assert [p["partition"] for p in described["partitions"]] == [0, 1, 2]
    for part in described["partitions"]:
        assert part["leader"] in part["replicas"] and sorted(part["isr"]) == [1, 2, 3], part
    cluster = call(action="describe_cluster")
    assert sorted(n["id"] for n in cluster["nodes"]) == [1, 2, 3]
    assert cluster["controller"] in (1, 2, 3) and cluster["cluster_id"]
    admin.call({"op": "produce", "topic": "java-admin", "partition": 1, "count": 5})
    offsets = call(action="list_offsets", topic="java-admin", partitions=3)
    assert offsets == {"earliest": {"0": 0, "1": 0, "2": 0},
                       "latest": {"0": 0, "1": 5, "2": 0}, "ok": True}  # fmt: skip
    call(action="delete_topic", topic="java-admin")

    def gone() -> Event | None:
        # Every node applies the deletion a moment after it is committed (as with Kafka).
        answer = ask(action="describe_topic", topic="java-admin")
        return answer if "UnknownTopicOrPartition" in answer.get("cause", "") else None

    poll_until(gone, 30, "java-admin gone from the node asked")
    assert_newest_versions_used(admin.log)


def assert_newest_versions_used(log: str) -> None:
    """The client saw exactly what the listener serves (`SUPPORTED`: README's table) and
    chose our newest version of every API: it knows newer ones of each."""
    line = next((x for x in log.splitlines() if "API versions: (" in x), None)
    assert line is not None, log[-2000:]
    offered = {int(key): (int(low), int(high or low), int(usable))
               for key, low, high, usable in OFFERED.findall(line)}  # fmt: skip
    served = {key: (v.min_version, v.max_version) for key, v in SUPPORTED.items()}
    assert {key: (low, high) for key, (low, high, _) in offered.items()} == served
    assert all(usable == high for _, high, usable in offered.values()), offered
    assert readme_java_column() == {key: high for key, (_, high) in served.items()}


def readme_java_column() -> dict[int, int]:
    """README's table of the Kafka listener's APIs: the Java client's column, by API key."""
    text = (REPO / "README.md").read_text()
    rows = re.findall(r"^\| [A-Za-z]+ \((\d+)\) \|.*\| (\d+) \|$", text, re.M)
    return {int(key): int(version) for key, version in rows}


def test_offsets_sent_to_a_transaction_commit_and_abort_with_it(
    java: JavaClients, group_cluster: launcher.LocalCluster
) -> None:
    """sendOffsetsToTransaction (AddOffsetsToTxn, then TxnOffsetCommit v3 to the group's
    coordinator) in three transactions, committed, committed, aborted: the group's offset is
    the second one's (the first's overwritten, the aborted one's dropped)."""
    client = java.start()
    client.call({"op": "admin", "action": "create_topic", "topic": "java-eos", "partitions": 1})
    ended = client.call({"op": "transactions", "topic": "java-eos", "partitions": 1,
                         "txn_id": "je", "outcomes": [True, True, False],
                         "offsets_group": "java-eos-group"})  # fmt: skip
    assert ended == {"ended": 3}
    bootstrap = ",".join(group_cluster.kafka_bootstrap)
    assert committed(bootstrap, "java-eos-group", "java-eos", 1) == [2]
