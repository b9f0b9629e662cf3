"""Issue 19, defect 7: forged producer ids fill a partition's producer table.

Produce needs no InitProducerId, so a client can send batches under any producer ids it likes.
Before the fix, once one partition's table held `producers_per_partition_max` (20,000) ids,
every new idempotent producer on it was refused (THROTTLING_QUOTA_EXCEEDED) for a whole
`producer_id_expiration_ms` (a day), and the client retried forever. Now a newcomer evicts the
least recently used producer (docs/semantics.md, "Limits"), so an honest producer that arrives
after the flood is acknowledged at once.

The flood goes through raw Produce requests, one forged batch each (producer ids from 2^62 up,
and 2^63-1, which no allocator hands out), many in flight on one connection.
"""

from __future__ import annotations

import asyncio

import pytest

from cluster import native as p
from cluster.client import Admin, Client, Producer
from statemachine.errors import ErrorCode
from statemachine.limits import DEFAULT_LIMITS
from statemachine.records import Record, RecordBatch
from tests.adversarial.conftest import Known, assert_intact

pytestmark = pytest.mark.asyncio(loop_scope="function")

TOPIC = "flooded"
TABLE_MAX = DEFAULT_LIMITS.producers_per_partition_max
FORGED_FIRST = 2**62
IN_FLIGHT = 100
FLOOD_TIMEOUT_S = 120.0
# An honest producer's first records once the table is full: acknowledged promptly (before
# the fix they never were, however long one waited).
HONEST_ACK_TIMEOUT_S = 10.0


def forged_batch(producer_id: int) -> bytes:
    return RecordBatch(producer_id, 0, 7, (Record(None, b"forged", 1),)).encode()


async def _flood(client: Client, producer_ids: list[int]) -> int:
    """Send one forged batch per id; returns how many were appended."""
    slots = asyncio.Semaphore(IN_FLIGHT)

    async def one(producer_id: int) -> bool:
        entry = p.ProduceEntry(TOPIC, 0, forged_batch(producer_id))
        async with slots:
            response = await client.send_to_leader(TOPIC, 0, p.Produce(10_000, (entry,)))
        assert isinstance(response, p.ProduceResponse)
        return response.results[0].error == ErrorCode.NONE

    appended = await asyncio.gather(*(one(pid) for pid in producer_ids))
    return sum(appended)


async def _producer_ids(client: Client) -> set[int]:
    (described,) = await Admin(client).describe_producers(TOPIC, [0])
    return {d.producer_id for d in described.producers}


async def test_a_flood_of_forged_producer_ids_does_not_lock_out_a_new_producer(
    known: Known, client: Client
) -> None:
    await Admin(client).create_topic(TOPIC, 1, 3)
    forged = [*range(FORGED_FIRST, FORGED_FIRST + TABLE_MAX + 500), 2**63 - 1]
    async with asyncio.timeout(FLOOD_TIMEOUT_S):
        appended = await _flood(client, forged)
    assert appended >= TABLE_MAX, f"only {appended} forged batches appended"
    held = await _producer_ids(client)
    assert len(held) == TABLE_MAX, "the table is full of forged ids"

    async with Producer(client) as honest:
        acks = [await honest.send(TOPIC, b"honest-%d" % i, partition=0) for i in range(3)]
        async with asyncio.timeout(HONEST_ACK_TIMEOUT_S):
            done = await asyncio.gather(*acks)
    assert [m.duplicate for m in done] == [False, False, False]
    held = await _producer_ids(client)
    assert done[0].producer_id in held
    assert len(held) == TABLE_MAX
    assert FORGED_FIRST not in held, "the least recently used forged id was evicted"
    await Admin(client).delete_topic(TOPIC)
    await assert_intact(known)
