"""Issue 19, defect 1: a Fetch cannot make a node build, or hold, more than its budgets.

A ~12 KB Fetch listing one partition 1,024 times once made the leader build a ~1 GiB answer
(each entry got at least one batch, even past the response budget), and unread answers
pipelined on one connection piled up in the node. Here the topic `bulk` holds large batches
(`BULK_VALUE_BYTES` each) on `BULK_PARTITIONS` partitions, so that one node leads at least three
of them, and every test ends with `assert_intact`.

The rules checked are Kafka's (KIP-74): only the first partition with data gives at least one
batch whatever the budgets (so a consumer whose next batch exceeds them still progresses); the
answer as a whole keeps to `min(max_bytes, Limits.fetch_bytes_max)` and each partition to its
own `max_bytes`; a partition listed twice is refused before anything is read.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from cluster import native as p
from cluster.client import Admin, Client, Consumer, ConsumerConfig, Producer
from cluster.config import Limits
from statemachine.errors import ErrorCode
from statemachine.limits import KIB, MIB
from tests.adversarial.conftest import (
    Known,
    assert_intact,
    exchange,
    leaders,
    open_raw,
    peak_rss_bytes,
    pid_at,
    settled_rss_bytes,
)
from tests.polling import apoll_until

pytestmark = pytest.mark.asyncio(loop_scope="function")

LIMITS = Limits()
BULK_TOPIC = "bulk"
BULK_PARTITIONS = 7  # among 3 nodes: one leads at least 3
BULK_BATCHES = 4  # per partition, one record each
BULK_VALUE_BYTES = 250 * KIB
BUDGET_BYTES = LIMITS.fetch_bytes_max
# Growth of a node's RSS that pipelined, unread answers may cause: the answer bytes a
# connection may hold, one answer beyond them, and room for the allocator.
UNREAD_GROWTH_BYTES_MAX = LIMITS.answer_bytes_per_connection_max + BUDGET_BYTES + 32 * MIB


def bulk_value(partition: int, index: int) -> bytes:
    return b"%d-%d:" % (partition, index) + b"b" * BULK_VALUE_BYTES


@pytest.fixture(scope="module")
def bulk(known: Known) -> Known:
    """The module's cluster, with `bulk` filled as well."""
    asyncio.run(_produce_bulk(known))
    return known


async def _produce_bulk(known: Known) -> None:
    client = Client(known.cluster.bootstrap, request_timeout_s=10.0)
    try:
        await Admin(client).create_topic(BULK_TOPIC, BULK_PARTITIONS, 3)
        async with Producer(client) as producer:
            acks = [
                await producer.send(BULK_TOPIC, bulk_value(n, i), partition=n)
                for n in range(BULK_PARTITIONS)
                for i in range(BULK_BATCHES)
            ]
            await asyncio.gather(*acks)
    finally:
        await client.close()


async def _busiest_leader(client: Client) -> tuple[str, list[int]]:
    """The node that leads the most `bulk` partitions, and those partitions (at least 3)."""

    async def found() -> tuple[str, list[int]] | None:
        by_node: dict[str, list[int]] = {}
        for partition, address in (await leaders(client, BULK_TOPIC)).items():
            by_node.setdefault(address, []).append(partition)
        address, led = max(by_node.items(), key=lambda item: len(item[1]), default=("", []))
        return (address, sorted(led)) if len(led) >= 3 else None

    return await apoll_until(found, 30.0, "a node leading 3 partitions of bulk")


async def test_a_fetch_listing_one_partition_1024_times_is_refused(
    bulk: Known, client: Client
) -> None:
    address = (await leaders(client, BULK_TOPIC))[0]
    pid = pid_at(bulk, address)
    entry = p.FetchPartition(BULK_TOPIC, 0, 0, 1 * MIB)
    fetch = p.Fetch(0, BUDGET_BYTES, (entry,) * LIMITS.partitions_per_request_max, False)
    (answer,) = await exchange(address, [fetch])
    assert isinstance(answer, p.ErrorResponse), answer
    assert answer.error == ErrorCode.INVALID_REQUEST
    assert "bulk-0" in answer.info.message
    assert peak_rss_bytes(pid) <= 400 * MIB, "the node built an answer it then refused"
    await assert_intact(bulk)


@pytest.mark.parametrize(
    ("max_bytes", "partition_max_bytes", "batches"),
    [
        pytest.param(1, 1 * MIB, 1, id="a response budget of 1 byte"),
        pytest.param(BUDGET_BYTES, 1, 1, id="partition budgets of 1 byte"),
        pytest.param(600 * KIB, 1 * MIB, 2, id="a response budget of 2.3 batches"),
    ],
)
async def test_only_the_first_partition_with_data_may_exceed_the_budget(
    bulk: Known, client: Client, max_bytes: int, partition_max_bytes: int, batches: int
) -> None:
    address, led = await _busiest_leader(client)
    end = BULK_BATCHES  # one record per batch: the log end of every bulk partition
    # The first entry is at its log end (no data), so the second is the first with data; then
    # the other led partitions, then distinct partitions that do not exist up to 1,024 entries.
    wanted = [p.FetchPartition(BULK_TOPIC, led[0], end, partition_max_bytes)]
    wanted += [p.FetchPartition(BULK_TOPIC, n, 0, partition_max_bytes) for n in led[1:]]
    absent = range(BULK_PARTITIONS, BULK_PARTITIONS + LIMITS.partitions_per_request_max)
    wanted += [p.FetchPartition(BULK_TOPIC, n, 0, partition_max_bytes) for n in absent]
    fetch = p.Fetch(0, max_bytes, tuple(wanted[: LIMITS.partitions_per_request_max]), False)

    (answer,) = await exchange(address, [fetch])

    assert isinstance(answer, p.FetchResponse), answer
    results = {r.partition: r for r in answer.results}
    assert all(results[n].error == ErrorCode.NONE for n in led), answer.results[: len(led)]
    given = {r.partition: len(r.batches) for r in answer.results if r.batches}
    assert given == {led[1]: batches}, f"batches per partition: {given}"
    sizes = [len(b.batch) for b in results[led[1]].batches]
    assert sum(sizes) <= min(max_bytes, partition_max_bytes) or len(sizes) == 1, sizes
    await assert_intact(bulk)


async def test_a_consumer_whose_batches_exceed_its_budgets_still_progresses(
    bulk: Known, client: Client
) -> None:
    consumer = Consumer(client, ConsumerConfig(max_wait_ms=0, max_bytes=1, partition_max_bytes=1))
    await consumer.assign(BULK_TOPIC)
    read: Counter[bytes] = Counter()

    async def all_read() -> bool:
        read.update(r.value or b"" for r in await consumer.poll())
        return len(read) == BULK_PARTITIONS * BULK_BATCHES

    await apoll_until(all_read, 30.0, "every bulk record read one batch at a time")
    expected = {bulk_value(n, i) for n in range(BULK_PARTITIONS) for i in range(BULK_BATCHES)}
    assert set(read) == expected
    assert max(read.values()) == 1
    await assert_intact(bulk)


async def test_a_consumer_with_a_small_budget_reads_every_partition_in_turn(
    bulk: Known, client: Client
) -> None:
    """With room for one batch per fetch, each of a leader's partitions yields a batch within
    as many polls as it leads partitions: none waits for another's backlog to drain."""
    _, led = await _busiest_leader(client)
    budget = BULK_VALUE_BYTES + 64 * KIB  # one batch per fetch
    consumer = Consumer(
        client, ConsumerConfig(max_wait_ms=0, max_bytes=budget, partition_max_bytes=budget)
    )
    for partition in led:
        await consumer.seek(BULK_TOPIC, partition, 0)
    served: list[int] = []
    for _ in range(len(led)):
        records = await apoll_until(consumer.poll, 10.0, "a poll with records")
        assert len({r.partition for r in records}) == 1, "more than one batch per fetch"
        served.append(records[0].partition)
    assert sorted(served) == led, f"partitions served in {len(led)} polls: {served}"
    await assert_intact(bulk)


async def test_unread_pipelined_fetches_hold_bounded_memory(bulk: Known, client: Client) -> None:
    address, led = await _busiest_leader(client)
    pid = pid_at(bulk, address)
    before = await settled_rss_bytes(pid)
    # Each answer is as large as the budget allows: ~1 MiB from each of 3 or more partitions.
    wanted = tuple(p.FetchPartition(BULK_TOPIC, n, 0, 1 * MIB) for n in led)
    fetch = p.Fetch(0, BUDGET_BYTES, wanted, False)
    count = LIMITS.in_flight_requests_per_connection_max
    _, writer = await open_raw(address)
    try:
        writer.write(b"".join(p.encode_request(i, fetch) for i in range(1, count + 1)))
        await writer.drain()
        held = await settled_rss_bytes(pid) - before  # never reading a byte of the answers
    finally:
        writer.close()
    assert held <= UNREAD_GROWTH_BYTES_MAX, f"{count} unread fetches hold {held >> 20} MiB"
    await assert_intact(bulk)
