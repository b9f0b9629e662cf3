"""Duties that run on timers, on a cluster configured with short intervals and small segments.

- Transactional-id expiry (2 s): the leader stamps `ExpireTransactionalIds` entries; every
  replica removes the idle id at the same index, and InitProducerId then allocates a new PID.
  The test polls with a probe that cannot refresh the id, so it waits for the expiry itself,
  not for a guessed amount of time.
- Retention by bytes: the leader proposes `AdvanceLogStart` when whole segments are out of
  retention; the log start moves on every replica and old offsets are no longer served.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from cluster import native as p
from cluster.broker.internal_topics import partition_of
from cluster.client import Admin, Client, ClientError, Consumer, Producer, ProducerConfig
from cluster.config import Limits
from cluster.local import launcher
from statemachine.errors import ErrorCode
from tests.cluster.conftest import running_cluster
from tests.polling import apoll_until

pytestmark = pytest.mark.asyncio(loop_scope="function")
TXN_STATE_PARTITIONS = Limits().txn_state_topic_partitions
# What the coordinator answers while its topic is being created and its leaders elected.
STARTING = frozenset(
    {
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    }
)
FAST_DUTIES = (
    "[timing]\ntransactional_id_expiration_ms = 2000\nexpiry_tick_interval_ms = 200\n"
    "retention_check_interval_ms = 200\n[limits]\nsegment_bytes_max = 65536\n"
)


@pytest.fixture(scope="module")
def expiring_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[launcher.LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("expiry"), FAST_DUTIES) as cluster:
        yield cluster


async def replicas_converge(
    client: Client, addresses: list[str], group: str = "__metadata", timeout_s: float = 10
) -> None:
    """Every replica of `group` reaches the same applied index (so the same state)."""

    async def one_index() -> bool:
        statuses = [await Admin(client).cluster_status(a) for a in addresses]
        applied = {next(g.last_applied for g in s.groups if g.group == group) for s in statuses}
        return len(applied) == 1

    await apoll_until(one_index, timeout_s, f"every replica of {group} at one applied index")


async def served(client: Client, request: p.InitProducerId) -> p.Response:
    """The first InitProducerId of a cluster creates the transaction state topic: asked again
    until its coordinator answers."""

    async def answered() -> p.Response | None:
        try:
            return await client.send_any(request)
        except ClientError as exc:
            if exc.error not in STARTING:
                raise
            return None

    return await apoll_until(answered, 20, "the transaction coordinator")


async def expired(client: Client, txn_id: str, holder: p.InitProducerIdResponse) -> int | None:
    """The producer id InitProducerId gives `txn_id` once the registry forgot it; None before.

    The probe names an epoch the id never had, so while the id is registered it is refused as
    fenced and touches nothing (a call that bumped or retried would refresh the id and keep it
    alive); once the id is gone it registers afresh, at epoch 0.
    """
    probe = p.InitProducerId(txn_id, 60_000, holder.producer_id, holder.epoch + 7)
    try:
        fresh = await client.send_any(probe)
    except ClientError as exc:
        if exc.error != ErrorCode.PRODUCER_FENCED:
            raise
        return None
    assert isinstance(fresh, p.InitProducerIdResponse)
    assert fresh.epoch == 0
    return fresh.producer_id


async def test_idle_transactional_id_expires_on_every_replica(
    expiring_cluster: launcher.LocalCluster,
) -> None:
    client = Client(expiring_cluster.bootstrap)
    try:
        first = await served(client, p.InitProducerId("nightly-job", 60_000, -1, -1))
        assert isinstance(first, p.InitProducerIdResponse)
        touched = time.monotonic()
        again = await client.send_any(p.InitProducerId("nightly-job", 60_000, -1, -1))
        assert isinstance(again, p.InitProducerIdResponse)
        assert (again.producer_id, again.epoch) == (first.producer_id, 1)  # not expired yet

        assert await expired(client, "nightly-job", again) is None  # the probe is fenced
        fresh_pid = await apoll_until(
            lambda: expired(client, "nightly-job", again),
            15,
            "the idle transactional id to expire",
            interval_s=0.2,
        )
        # The leader stamped the last touch after `touched`, and expires 2 s after that stamp.
        assert time.monotonic() - touched >= 1.9
        assert fresh_pid != first.producer_id
        # The id's transaction state partition: every replica applied the same expiry.
        txn_state = f"__transaction_state-{partition_of('nightly-job', TXN_STATE_PARTITIONS)}"
        await replicas_converge(client, expiring_cluster.bootstrap, txn_state)
    finally:
        await client.close()


async def test_retention_by_bytes_moves_the_log_start_on_every_replica(
    expiring_cluster: launcher.LocalCluster,
) -> None:
    client = Client(expiring_cluster.bootstrap)
    try:
        await Admin(client).create_topic("short-lived", 1, 3, retention_bytes=150_000)
        async with Producer(client, ProducerConfig(batch_size_bytes=8_000)) as producer:
            futures = [await producer.send("short-lived", bytes(100)) for _ in range(5_000)]
            await asyncio.gather(*futures)
        start = await apoll_until(
            lambda: Admin(client).list_offsets("short-lived", 0, -2), 20, "the log start to move"
        )
        assert 0 < start < 5_000
        consumer = Consumer(client)
        await consumer.seek("short-lived", 0, 0)
        with pytest.raises(ClientError) as gone:
            await consumer.poll(0)
        assert gone.value.error == ErrorCode.OFFSET_OUT_OF_RANGE
        await consumer.seek("short-lived", 0, Consumer.EARLIEST)
        first = await consumer.poll(0)
        assert first[0].offset >= start
        await replicas_converge(client, expiring_cluster.bootstrap, "short-lived-0")
    finally:
        await client.close()
