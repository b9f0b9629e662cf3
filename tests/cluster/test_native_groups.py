"""Consumer groups through the native protocol: the client library's `GroupConsumer`, a group
shared with a Kafka client, and `raftbroker consume --group` / `raftbroker groups ...`, on the
consumer-group cluster of tests/cluster/conftest.py (`group_cluster`: 200 ms initial rebalance
delay, sessions from 1 s).

- Two native members split a topic's partitions and read every record once, each from its own
  partitions; after both commit and leave, a new member resumes exactly after the commits.
- The group's leader assigns a subscribed topic created after the group formed, once its look
  at metadata (each `metadata_max_age_ms`) sees it.
- A native member and librdkafka share one group: whichever leads, the other reads the
  assignment it made (Kafka's consumer protocol and range assignor on both sides).
- The CLI: `consume --group` prints, commits and resumes (its `--session-timeout-ms` reaches the
  coordinator, which refuses one below its minimum); `groups list`, `describe` (committed,
  log end, lag), `reset` (dry run, then --execute; refused while the group has members) and
  `delete` (refused while it has members); a missing group is one line, not a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import pytest
import pytest_asyncio

from cluster import native as p
from cluster.client import (
    Admin,
    Client,
    ConsumedRecord,
    Consumer,
    GroupConfig,
    GroupConsumer,
    Producer,
)
from cluster.local import launcher
from tests.cluster.test_cli import ok as cli_ok
from tests.cluster.test_cli import raftbroker
from tests.kafka_group_clients import member
from tests.polling import poll_until

pytestmark = pytest.mark.asyncio(loop_scope="function")
PARTITIONS = 4
TIMEOUT_S = 60.0
MEMBER = GroupConfig(
    session_timeout_ms=3_000,
    heartbeat_interval_ms=500,
    client_id="test",
    auto_offset_reset=Consumer.EARLIEST,
)


@pytest_asyncio.fixture
async def client(group_cluster: launcher.LocalCluster) -> AsyncIterator[Client]:
    c = Client(group_cluster.bootstrap, request_timeout_s=5.0)
    try:
        yield c
    finally:
        await c.close()


async def new_topic(client: Client, records: int = 0) -> str:
    topic = f"ngrp-{uuid.uuid4().hex[:8]}"
    await Admin(client).create_topic(topic, PARTITIONS, 3)
    await produce(client, topic, range(records))
    return topic


async def produce(client: Client, topic: str, values: range) -> None:
    async with Producer(client) as producer:
        sent = [
            await producer.send(topic, f"v{i}".encode(), partition=i % PARTITIONS) for i in values
        ]
        await asyncio.gather(*sent)


Read = dict[int, list[ConsumedRecord]]


async def poll_all(members: list[GroupConsumer], until: Callable[[Read], bool], what: str) -> Read:
    """Every member polling in a loop of its own, as an application's consumers would (one
    member's JoinGroup waits for the others to rejoin), until `until(read)`; the records each
    read, by member index."""
    read: Read = {i: [] for i in range(len(members))}
    done = asyncio.Event()

    async def loop(i: int, one: GroupConsumer) -> None:
        while not done.is_set():
            read[i] += await one.poll(50)
            if until(read):
                done.set()

    try:
        async with asyncio.timeout(TIMEOUT_S), asyncio.TaskGroup() as tasks:
            for i, one in enumerate(members):
                tasks.create_task(loop(i, one))
    except TimeoutError:
        owned = [sorted(m.assignment()) for m in members]
        raise TimeoutError(f"timed out after {TIMEOUT_S} s waiting for {what}: {owned}") from None
    return read


def split(members: list[GroupConsumer]) -> Callable[[Read], bool]:
    """Every member owns some partitions, and each partition one member."""

    def done(_read: Read) -> bool:
        owned = [{i for _, i in m.assignment()} for m in members]
        every = sorted(i for o in owned for i in o)
        return all(owned) and every == list(range(PARTITIONS))

    return done


def count(want: int) -> Callable[[Read], bool]:
    return lambda read: sum(len(r) for r in read.values()) >= want


def values(records: list[ConsumedRecord]) -> list[str]:
    return [(r.value or b"").decode() for r in records]


async def test_two_native_members_split_the_partitions_then_a_third_resumes_after_commits(
    client: Client,
) -> None:
    topic = await new_topic(client)
    group = f"ng-{uuid.uuid4().hex[:6]}"
    members = [GroupConsumer(client, group, [topic], MEMBER) for _ in range(2)]
    await poll_all(members, split(members), "the members splitting the partitions")
    owned = [{i for _, i in m.assignment()} for m in members]
    await produce(client, topic, range(200))
    read = await poll_all(members, count(200), "200 records")
    every = values(read[0] + read[1])
    assert sorted(every) == sorted(f"v{i}" for i in range(200)), "lost or read twice"
    for i, one in enumerate(members):  # each read its own partitions only
        assert {r.partition for r in read[i]} <= owned[i]
        assert one.rebalances == 1 or owned[i] == {r.partition for r in read[i]}
        await one.commit()
    for one in members:
        await one.close()

    await produce(client, topic, range(200, 240))
    third = GroupConsumer(client, group, [topic], MEMBER)
    try:
        again = await poll_all([third], count(40), "the records after the commits")
        assert sorted(values(again[0])) == sorted(f"v{i}" for i in range(200, 240))
        assert third.assignment() == {(topic, i) for i in range(PARTITIONS)}
    finally:
        await third.close()


async def test_a_commit_outside_the_log_starts_over_at_auto_offset_reset_losing_nothing(
    client: Client,
) -> None:
    """A commit past the log's end (as one retention has passed would be before it) makes
    that partition start over at auto_offset_reset; the other partitions read on from their
    commits, none of their records lost to the reset."""
    topic = await new_topic(client, records=40)  # offsets 0-9 in each partition
    group = f"oor-{uuid.uuid4().hex[:6]}"
    entries = (p.CommitEntry(topic, 0, 1_000, ""), p.CommitEntry(topic, 1, 5, ""))
    committed = await client.call_coordinator(group, p.OffsetCommit(group, -1, "", "", entries))
    assert isinstance(committed, p.OffsetCommitResponse)
    assert all(r.error == 0 for r in committed.results)
    member = GroupConsumer(client, group, [topic], MEMBER)
    try:
        read = await poll_all([member], count(35), "every record but partition 1's first five")
    finally:
        await member.close()
    expected = [i for i in range(40) if not (i % PARTITIONS == 1 and i < 20)]
    assert sorted(values(read[0])) == sorted(f"v{i}" for i in expected)


async def test_the_leader_assigns_a_subscribed_topic_created_after_the_group_formed(
    client: Client,
) -> None:
    first = await new_topic(client, records=4)
    later = f"ngrp-{uuid.uuid4().hex[:8]}"
    config = replace(MEMBER, metadata_max_age_ms=300)
    one = GroupConsumer(client, f"later-{uuid.uuid4().hex[:6]}", [first, later], config)
    try:
        await poll_all([one], count(4), "the first topic's records")
        assert {t for t, _ in one.assignment()} == {first}
        await one.commit()  # the rejoin that assigns the new topic resumes the first from here
        await Admin(client).create_topic(later, PARTITIONS, 3)
        await produce(client, later, range(4))
        read = await poll_all([one], count(4), "the records of the topic created later")
        assert sorted(values(read[0])) == ["v0", "v1", "v2", "v3"]
        assert {t for t, _ in one.assignment()} == {first, later}
    finally:
        await one.close()


async def test_a_native_member_and_librdkafka_share_a_group_whichever_leads(
    client: Client, group_cluster: launcher.LocalCluster
) -> None:
    topic = await new_topic(client)
    group = f"mixed-{uuid.uuid4().hex[:6]}"
    native = GroupConsumer(client, group, [topic], MEMBER)
    await poll_all([native], lambda _r: len(native.assignment()) == PARTITIONS, "native alone")
    kafka = member("confluent-kafka", ",".join(group_cluster.kafka_bootstrap), group)
    try:
        kafka.subscribe(topic)  # the native member leads the rebalance this causes

        def shared(_read: Read) -> bool:
            mine = {i for _, i in native.assignment()}
            theirs = kafka.assignment()
            return bool(mine and theirs) and sorted([*mine, *theirs]) == list(range(PARTITIONS))

        await poll_all([native], shared, "the native leader's assignment reaching librdkafka")
        await native.close()  # librdkafka leads the next rebalance, alone
        poll_until(
            lambda: kafka.assignment() == set(range(PARTITIONS)),
            TIMEOUT_S,
            "librdkafka taking every partition",
        )
        native = GroupConsumer(client, group, [topic], MEMBER)
        await poll_all([native], shared, "librdkafka's assignment reaching the native member")
    finally:
        kafka.close()
        await native.close()


# -- the CLI ------------------------------------------------------------------------------------


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    return cli_ok(result)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, f"exit {result.returncode}: {result.stdout}{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture
def cli_bootstrap(group_cluster: launcher.LocalCluster) -> list[str]:
    return [a for address in group_cluster.bootstrap for a in ("--bootstrap", address)]


async def test_consume_group_commits_what_it_printed_and_groups_describes_resets_deletes(
    client: Client, cli_bootstrap: list[str]
) -> None:
    topic = await new_topic(client, records=40)
    group = f"cli-{uuid.uuid4().hex[:6]}"
    at = cli_bootstrap

    def consume(*extra: str) -> list[str]:
        out = ok(raftbroker("consume", topic, "--group", group, "--timeout-ms", "800", *at,
                            *extra))  # fmt: skip
        return out.split()

    first = consume("--from-beginning", "--max-messages", "25", "--session-timeout-ms", "2000")
    assert len(first) == 25
    # The session reaches the coordinator, which allows 1 s and more here.
    short = one_line_error(raftbroker("consume", topic, "--group", group, *at,
                                      "--session-timeout-ms", "500"))  # fmt: skip
    assert "INVALID_SESSION_TIMEOUT" in short, short
    alone = one_line_error(raftbroker("consume", topic, *at, "--session-timeout-ms", "2000"))
    assert "use it with --group" in alone, alone
    rest = consume("--from-beginning")  # --from-beginning: only where the group has no commit
    assert sorted(first + rest) == sorted(f"v{i}" for i in range(40)), "lost or read twice"

    listed = json.loads(ok(raftbroker("groups", "list", "--json", *at)))
    assert {"group": group, "state": "Empty", "protocol_type": "consumer"} in listed
    described = json.loads(ok(raftbroker("groups", "describe", group, "--json", *at)))
    assert described["state"] == "Empty" and described["members"] == []
    rows = [
        (r["partition"], r["committed"], r["log_end"], r["lag"]) for r in described["partitions"]
    ]
    assert rows == [(i, 10, 10, 0) for i in range(PARTITIONS)]

    await produce(client, topic, range(40, 44))  # one more per partition: a lag of 1 each
    described = json.loads(ok(raftbroker("groups", "describe", group, "--json", *at)))
    assert [r["lag"] for r in described["partitions"]] == [1] * PARTITIONS

    reset = ["groups", "reset", group, "--topic", topic, "--to-offset", "8", *at]
    dry = ok(raftbroker(*reset)).splitlines()
    assert dry[0] == "TOPIC\tPARTITION\tNEW-OFFSET"  # issue 41: it printed bare lines
    assert f"{topic}\t0\t8" in dry and "dry run" in dry[-1]
    assert sorted(consume()) == ["v40", "v41", "v42", "v43"]  # the dry run committed nothing
    ok(raftbroker(*reset, "--partition", "1", "--execute"))
    assert consume() == ["v33", "v37", "v41"]  # partition 1 from offset 8 (v1 + 4 * 8)
    table = ok(raftbroker("groups", "describe", group, *at))
    assert f"group {group}: Empty, 0 members" in table

    live = GroupConsumer(client, group, [topic], MEMBER)
    try:
        await poll_all([live], lambda _r: bool(live.assignment()), "a live member")
        async with polled(live):
            await live_group_refusals(live, group, topic, reset, at)
        assert live.assignment()  # still a member after the refusals
    finally:
        await live.close()
    assert ok(raftbroker("groups", "delete", group, *at)).strip() == f"deleted group {group}"
    gone = one_line_error(raftbroker("groups", "describe", group, *at))
    assert gone == f"raftbroker: group {group!r} does not exist (GROUP_ID_NOT_FOUND)"


@contextlib.asynccontextmanager
async def polled(member: GroupConsumer) -> AsyncIterator[None]:
    """`member` polling (so heartbeating) meanwhile: its 3 s session outlives CLI commands
    that take seconds each on a loaded machine."""
    stop = asyncio.Event()

    async def loop() -> None:
        while not stop.is_set():
            await member.poll(50)

    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(loop())
        try:
            yield
        finally:
            stop.set()


async def live_group_refusals(
    live: GroupConsumer, group: str, topic: str, reset: list[str], at: list[str]
) -> None:
    """Describe shows the live member; reset and delete are refused while it is there."""

    async def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(raftbroker, *args)

    described = json.loads(ok(await cli("groups", "describe", group, "--json", *at)))
    [shown] = described["members"]
    assert (shown["member_id"], shown["client_id"]) == (live.member_id, "test")
    assert shown["host"].startswith("/127.") and described["state"] == "Stable"
    assert shown["partitions"] == [{"topic": topic, "partition": i} for i in range(PARTITIONS)]
    assert {r["member_id"] for r in described["partitions"]} == {live.member_id}
    table = ok(await cli("groups", "describe", group, *at))
    assert f"members of {group}" in table and "Stable, 1 member" in table
    refused = one_line_error(await cli(*reset, "--execute"))
    assert "only while it is empty" in refused and "NON_EMPTY_GROUP" in refused
    refused = one_line_error(await cli("groups", "delete", group, *at))
    assert "has members" in refused
