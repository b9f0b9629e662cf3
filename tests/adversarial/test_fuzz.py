"""The fuzzer against a live cluster, and the frames an earlier fuzz found, replayed one by one.

Each listener is fuzzed for a few seconds from a fixed seed in the default run (the long run:
`pytest -m slow tests/adversarial/test_fuzz.py --fuzz-seconds 600 [--fuzz-seed N]`): requests
of every API and version generated from the schemas, valid and mutated, each connection's
answers checked against what the listener must do with its bytes (tests/fuzz/live.py), health
asked throughout; then no node may have logged an error or a traceback, and the cluster must
hold the known records exactly (`assert_intact`).

The replays (issue 40) are each a frame from the issue, or the request it describes, and the
answer Kafka gives it, on the node's Kafka listener:
1. Metadata v10 naming a topic by id with a null name: INVALID_REQUEST, as Kafka's KafkaApis
   answers v10-v11 (which name topics only), and the request pipelined behind it answered;
2. CreateTopics v2-v4 quoting a 32,767-character config name: INVALID_CONFIG, its message cut
   to fit (it broke the answer's 2-byte string length, answered UNKNOWN_SERVER_ERROR);
3. JoinGroup with a negative session timeout: INVALID_SESSION_TIMEOUT at once (it was parked
   with a deadline in the past, and answered REQUEST_TIMED_OUT by the node's safety net);
4. ApiVersions v3 with an invalid client software name: INVALID_REQUEST in v3, on a
   connection that stays open (KIP-511; it was closed);
5. a bad frame behind a ~1 MB Fetch, the client still writing: the whole answer, then a FIN.
"""

from __future__ import annotations

import asyncio
import random
import socket
import time

import pytest

from cluster.client import Admin, Client, Groups, Producer
from cluster.config import Limits
from cluster.kafka import codec
from cluster.kafka import messages as m
from statemachine.errors import ErrorCode
from tests.adversarial.conftest import (
    Known,
    assert_intact,
    current_cluster,
    partition_dirs,
    peak_rss_bytes,
    topic_of_dir,
)
from tests.fuzz import live
from tests.kafka_wire import calls_on, kafka_call, open_kafka, read_kafka_frame
from tests.polling import apoll_until

# alone: health is asked throughout and must answer 200, which a node's loop stalled past the
# election timeout by the other test worker's load would not (seen once on two workers).
pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.alone]

# A new group's first rebalance waits this long for more members (3 s by default): the fuzzer
# joins groups on short-lived connections, and waits on each.
EXTRA_TOML = """
[timing]
group_initial_rebalance_delay_ms = 300
"""
SHORT_FUZZ_S = 5.0
SHORT_SEEDS = {"kafka": 4_001, "native": 4_002}
LONG_FUZZ_S = 120.0
ANSWER_AT_ONCE_S = 2.0
COORDINATOR_TIMEOUT_S = 30.0
BIG_TOPIC = "fz-big"
BIG_RECORDS = 8
BIG_RECORD_BYTES = 120_000
CLIENT_RECEIVE_BUFFER_BYTES = 16 * 1024
STILL_WRITING_BYTES = 4 << 20


@pytest.fixture(scope="module")
def known_toml() -> str:
    return EXTRA_TOML


def _side(name: str) -> live.Side:
    return live.KafkaSide(Limits()) if name == "kafka" else live.NativeSide(Limits())


async def fuzz(known: Known, side_name: str, seconds: float, seed: int) -> None:
    nodes = current_cluster(known).nodes
    addresses = [n.kafka_address if side_name == "kafka" else n.client_address for n in nodes]
    health = [f"{n.host}:{n.http_port}" for n in nodes]
    report = await live.run(_side(side_name), addresses, health, seconds=seconds, seed=seed)
    peaks = ", ".join(f"{peak_rss_bytes(n.pid) >> 20}" for n in nodes)
    print(  # the run's figures, shown with -s
        f"fuzz {side_name} seed {seed}: {report.connections} connections, {report.requests} "
        f"requests ({dict(report.labels)}), {report.answers} answers, "
        f"{report.health_checks} health checks in {report.seconds:.1f} s; "
        f"peak RSS per node {peaks} MiB"
    )
    assert not report.failures, "\n".join(report.failures[:3])
    assert not report.health_failures, report.health_failures[:5]
    assert report.labels["valid"] and report.answers, "the fuzzer reached nothing"
    assert_nothing_logged(known)
    await assert_intact(known)


def assert_nothing_logged(known: Known) -> None:
    """No node logged an error: client input is refused in a line at WARNING at most."""
    current = current_cluster(known)
    for node in current.nodes:
        log = (current.data_dir / f"node{node.node_id}.log").read_text(errors="replace")
        errors = [line for line in log.splitlines() if " ERROR " in line]
        assert not errors, f"node {node.node_id}: {errors[:3]}"


@pytest.mark.parametrize("side", ["kafka", "native"])
async def test_a_short_seeded_fuzz_finds_nothing(known: Known, side: str) -> None:
    await fuzz(known, side, SHORT_FUZZ_S, SHORT_SEEDS[side])


@pytest.mark.slow
@pytest.mark.timeout(0)
@pytest.mark.parametrize("side", ["kafka", "native"])
async def test_a_long_fuzz_finds_nothing(
    known: Known, side: str, request: pytest.FixtureRequest
) -> None:
    seconds = request.config.getoption("--fuzz-seconds") or LONG_FUZZ_S
    seed = request.config.getoption("--fuzz-seed")
    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
    print(f"fuzz {side}: seed {seed}, {seconds} s")
    await fuzz(known, side, seconds, seed)


# -- the frames of issue 40 ------------------------------------------------------------------------


async def replay(
    address: str, frames: bytes, headers: list[m.RequestHeader]
) -> list[m.ResponseBody]:
    """Send `frames` on a fresh connection; the answers to `headers`, in order, each due at once."""
    reader, writer = await open_kafka(address)
    try:
        writer.write(frames)
        answers = []
        for header in headers:
            started = time.monotonic()
            body = await read_kafka_frame(reader)
            assert time.monotonic() - started < ANSWER_AT_ONCE_S, header
            correlation_id, answer = codec.decode_response(header, body)
            assert correlation_id == header.correlation_id
            answers.append(answer)
        return answers
    finally:
        writer.close()


def kafka_address(known: Known, node_id: int = 1) -> str:
    return next(n.kafka_address for n in current_cluster(known).nodes if n.node_id == node_id)


API_VERSIONS = m.ApiVersionsRequest("raftbroker-tests", "1")


async def test_metadata_v10_by_topic_id_is_invalid_and_the_next_request_answered(
    known: Known,
) -> None:
    frame = bytes.fromhex(
        "000000270003000a000000010005726570726f00020123456789abcdef0123456789abcdef000000000000"
    )
    behind = m.RequestHeader(m.Api.API_VERSIONS, 3, 2, "repro")
    metadata, versions = await replay(
        kafka_address(known),
        frame + codec.encode_request(behind, API_VERSIONS),
        [m.RequestHeader(m.Api.METADATA, 10, 1, "repro"), behind],
    )
    assert isinstance(metadata, m.MetadataResponse)
    (topic,) = metadata.topics
    assert (topic.error_code, topic.name) == (ErrorCode.INVALID_REQUEST, "")
    assert isinstance(versions, m.ApiVersionsResponse)
    assert versions.error_code == ErrorCode.NONE
    # By name in v11 as ever, and by id from v12: an unknown id is UNKNOWN_TOPIC_ID.
    topic_id = topic.topic_id
    by_name = await kafka_call(
        kafka_address(known),
        m.Api.METADATA,
        11,
        m.MetadataRequest((m.MetadataRequestTopic("known"),)),
    )
    assert isinstance(by_name, m.MetadataResponse)
    assert [(t.name, t.error_code) for t in by_name.topics] == [("known", ErrorCode.NONE)]
    by_id = await kafka_call(
        kafka_address(known),
        m.Api.METADATA,
        12,
        m.MetadataRequest((m.MetadataRequestTopic(None, topic_id),)),
    )
    assert isinstance(by_id, m.MetadataResponse)
    assert [t.error_code for t in by_id.topics] == [ErrorCode.UNKNOWN_TOPIC_ID]
    assert_nothing_logged(known)


@pytest.mark.parametrize("version", [2, 3, 4, 7])
async def test_a_create_topics_quoting_a_32767_character_name_fits_its_answer(
    known: Known, version: int
) -> None:
    long_name = "c" * (2**15 - 1)
    config = m.CreatableTopicConfig(long_name, "1")
    request = m.CreateTopicsRequest(
        (
            m.CreatableTopic("fz-quoted", 1, 1, (), (config,)),
            m.CreatableTopic("t" * (2**15 - 1), 1, 1),
        ),
        timeout=5_000,
    )
    header = m.RequestHeader(m.Api.CREATE_TOPICS, version, 1, "repro")
    (answer,) = await replay(
        kafka_address(known, 2), codec.encode_request(header, request), [header]
    )
    assert isinstance(answer, m.CreateTopicsResponse)
    config_refused, name_refused = answer.topics
    assert config_refused.error_code == ErrorCode.INVALID_CONFIG
    assert name_refused.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
    message = config_refused.error_message or ""
    assert "(32767 characters)" in message and len(message) < 200, message
    assert_nothing_logged(known)


async def test_a_join_group_with_a_negative_session_timeout_is_refused_at_once(
    known: Known,
) -> None:
    frame = bytes.fromhex(
        "00000035000b00000000000b0005726570726f0005667a722d6780000000000000086"
        "36f6e73756d657200000001000572616e676500000000"
    )
    coordinator = await find_coordinator(known, "fzr-g")
    (answer,) = await replay(
        coordinator, frame, [m.RequestHeader(m.Api.JOIN_GROUP, 0, 11, "repro")]
    )
    assert isinstance(answer, m.JoinGroupResponse)
    assert answer.error_code == ErrorCode.INVALID_SESSION_TIMEOUT
    assert_nothing_logged(known)


async def test_a_join_group_with_names_past_the_bound_is_refused(known: Known) -> None:
    """Found by this fuzzer: a Kafka member's protocol type (or protocol name) of thousands
    of characters was kept, and every native ListGroups and DescribeGroup answer about its
    group then broke the native wire's bound on a name, unreadable to every native client.
    A name a member brings is bounded as every name is, and refused past it, on both
    listeners (the rule is the broker core's)."""
    coordinator = await find_coordinator(known, "fzr-names")
    long_name = "c" * 300
    joins = [
        m.JoinGroupRequest(
            "fzr-names", 6_000, "", long_name, (m.JoinGroupRequestProtocol("range", b""),)
        ),
        m.JoinGroupRequest(
            "fzr-names", 6_000, "", "consumer", (m.JoinGroupRequestProtocol(long_name, b""),)
        ),
    ]
    for join in joins:
        answer = await kafka_call(coordinator, m.Api.JOIN_GROUP, 5, join)
        assert isinstance(answer, m.JoinGroupResponse)
        assert answer.error_code == ErrorCode.INVALID_REQUEST
    client = Client(current_cluster(known).bootstrap, request_timeout_s=10.0)
    try:
        listed = await Groups(client).list()  # every node's answer read by a native client
    finally:
        await client.close()
    assert "fzr-names" not in {g.group for g in listed}
    assert_nothing_logged(known)


async def find_coordinator(known: Known, group: str) -> str:
    """The Kafka address of `group`'s coordinator, once one is known (the offsets topic is
    created on the first ask)."""

    async def found() -> str | None:
        answer = await kafka_call(
            kafka_address(known), m.Api.FIND_COORDINATOR, 3, m.FindCoordinatorRequest(group)
        )
        assert isinstance(answer, m.FindCoordinatorResponse)
        if answer.error_code != ErrorCode.NONE:
            return None
        return f"{answer.host}:{answer.port}"

    return await apoll_until(found, COORDINATOR_TIMEOUT_S, f"{group}'s coordinator")


async def test_api_versions_with_an_invalid_software_name_is_answered(known: Known) -> None:
    reader, writer = await open_kafka(kafka_address(known, 3))
    try:
        bad = m.ApiVersionsRequest("-not valid", "1.0")
        versions, metadata = await calls_on(
            reader,
            writer,
            [(m.Api.API_VERSIONS, 3, bad), (m.Api.METADATA, 12, m.MetadataRequest(()))],
        )
    finally:
        writer.close()
    assert versions == m.ApiVersionsResponse(ErrorCode.INVALID_REQUEST, ())
    assert isinstance(metadata, m.MetadataResponse)  # the connection stayed open
    assert_nothing_logged(known)


async def test_a_bad_frame_behind_a_large_fetch_answer_cuts_nothing_off(known: Known) -> None:
    client = Client(current_cluster(known).bootstrap, request_timeout_s=10.0)
    try:
        await Admin(client).create_topic(BIG_TOPIC, 1, 3)
        async with Producer(client) as producer:
            sent = [
                await producer.send(BIG_TOPIC, bytes(BIG_RECORD_BYTES)) for _ in range(BIG_RECORDS)
            ]
            await asyncio.gather(*sent)
        leader = await leader_kafka_address(client, known)
    finally:
        await client.close()
    fetch = m.FetchRequest(
        0, 1, (m.FetchTopic(BIG_TOPIC, (m.FetchPartition(0, 0, 1 << 20),)),), max_bytes=1 << 20
    )
    header = m.RequestHeader(m.Api.FETCH, 12, 1, "repro")
    negative_length = b"\xff\xff\xff\xff"
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_RECEIVE_BUFFER_BYTES)
    sock.setblocking(False)
    host, _, port = leader.rpartition(":")
    async with asyncio.timeout(ANSWER_AT_ONCE_S * 5):
        await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
        reader, writer = await asyncio.open_connection(sock=sock)
    try:
        writer.write(
            codec.encode_request(header, fetch) + negative_length + bytes(STILL_WRITING_BYTES)
        )
        _, answer = codec.decode_response(header, await read_kafka_frame(reader))
        assert isinstance(answer, m.FetchResponse)
        (partition,) = answer.responses[0].partitions
        assert len(partition.records or b"") > (BIG_RECORDS - 1) * BIG_RECORD_BYTES
        async with asyncio.timeout(ANSWER_AT_ONCE_S * 5):
            assert await reader.read() == b""  # a FIN, not a reset
    finally:
        writer.close()
    assert_nothing_logged(known)


async def leader_kafka_address(client: Client, known: Known) -> str:
    response = await client.refresh([BIG_TOPIC])
    (meta,) = response.topics
    (partition,) = meta.partitions
    return next(
        n.kafka_address for n in current_cluster(known).nodes if n.node_id == partition.leader_id
    )


WIDE_TOPIC = "fz-wide"
WIDE_PARTITIONS = 500
WIDE_TIMEOUT_S = 90.0


async def terms(client: Client, known: Known) -> dict[tuple[int, str], int]:
    """Each Raft group's term as each node sees it."""
    admin = Admin(client)
    found = {}
    for node in current_cluster(known).nodes:
        status = await admin.cluster_status(node.client_address)
        found.update({(node.node_id, g.group): g.term for g in status.groups})
    return found


async def test_a_topic_of_500_partitions_deposes_no_leader(known: Known) -> None:
    """Issue 40, item 6: every group of every node re-elected at once, /healthz 503 ("no
    metadata leader known") on all three. A valid CreateTopics of hundreds of partitions
    (the fuzz generated them) had every node start that many groups in one turn of its loop,
    stalling it past the election timeout. Now a node starts (and stops) one group per turn:
    while a topic of 500 partitions is created, led and deleted, /healthz answers 200 on
    every node and no group that existed before changes its term."""
    nodes = current_cluster(known).nodes
    health = [f"{n.host}:{n.http_port}" for n in nodes]
    client = Client(current_cluster(known).bootstrap, request_timeout_s=10.0)
    report = live.Report("health", 0)
    stop = asyncio.Event()
    try:
        before = await terms(client, known)
        async with asyncio.TaskGroup() as tasks:
            poller = tasks.create_task(live.poll_health(health, report, stop))
            created = await kafka_call(
                kafka_address(known),
                m.Api.CREATE_TOPICS,
                7,
                m.CreateTopicsRequest((m.CreatableTopic(WIDE_TOPIC, WIDE_PARTITIONS, 3),), 60_000),
            )
            assert isinstance(created, m.CreateTopicsResponse)
            assert created.topics[0].error_code == ErrorCode.NONE

            async def all_led() -> bool:
                (meta,) = (await client.refresh([WIDE_TOPIC])).topics
                return sum(pm.leader_id >= 0 for pm in meta.partitions) == WIDE_PARTITIONS

            await apoll_until(all_led, WIDE_TIMEOUT_S, f"every partition of {WIDE_TOPIC} led")
            await Admin(client).delete_topic(WIDE_TOPIC)
            await apoll_until(
                lambda: gone(known), WIDE_TIMEOUT_S, f"{WIDE_TOPIC}'s groups stopped everywhere"
            )
            stop.set()
            await poller
        after = await terms(client, known)
    finally:
        stop.set()
        await client.close()
    assert not report.health_failures, report.health_failures[:5]
    changed = {k: (v, after.get(k)) for k, v in before.items() if after.get(k) != v}
    assert not changed, f"terms changed: {changed}"
    assert_nothing_logged(known)


async def gone(known: Known) -> bool:
    return WIDE_TOPIC not in map(topic_of_dir, partition_dirs(current_cluster(known)))
