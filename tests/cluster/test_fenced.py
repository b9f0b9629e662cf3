"""Fenced writes against a real cluster: a rerun micro-batch is appended once
(cluster/client/fenced.py).

A new `FencedWriter` per run stands for Spark running a task again after a crash: a new
producer session each time, the same sink, writer and batch id, the same records. Tests that
cut a write short wait on the writer's own progress (`parts_done`, `part_done`), never on the
clock, so they hold on a slow or loaded machine as on a fast one.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from cluster.client import Admin, Client, ConsumedRecord, Consumer, ProducerFencedError
from cluster.client.fenced import FencedWriter, FencedWriterConfig, SinkRecord
from cluster.local import launcher
from tests.cluster.conftest import wait_ready
from tests.cluster.test_cluster import kill_and_restart, leader_of

pytestmark = pytest.mark.asyncio(loop_scope="function")


def records(topic: str, first: int, count: int) -> list[SinkRecord]:
    return [
        SinkRecord(topic, f"k{i % 13}".encode() if i % 3 else None, f"v{i}".encode())
        for i in range(first, first + count)
    ]


async def parts_done(writer: FencedWriter, count: int, timeout_s: float = 30) -> None:
    """Until `writer` has had `count` parts answered (woken by each answer, not polling)."""
    async with asyncio.timeout(timeout_s):
        while writer.parts_done < count:
            writer.part_done.clear()
            await writer.part_done.wait()


async def values_in(cluster: Client, topic: str) -> Counter[bytes]:
    """Every value of the topic, read to its end (the high watermark of each partition)."""
    admin, consumer = Admin(cluster), Consumer(cluster)
    await consumer.assign(topic)
    ends = {
        (topic, info.partition): await admin.list_offsets(topic, info.partition, Consumer.LATEST)
        for info in await cluster.partitions(topic)
    }
    seen: Counter[bytes] = Counter()
    deadline = asyncio.get_running_loop().time() + 30
    while any(consumer.positions[k].offset < end for k, end in ends.items()):
        seen.update(r.value or b"" for r in await consumer.poll(100))
        assert asyncio.get_running_loop().time() < deadline, "topic not read to its end in 30 s"
    return seen


async def test_a_rerun_batch_is_appended_once_and_the_next_batch_goes_on(client: Client) -> None:
    await Admin(client).create_topic("fenced-rerun", 3, 3)
    batch = records("fenced-rerun", 0, 1_000)
    first = await FencedWriter(client, "totals-sink", 0).write(0, batch)
    assert (first.appended_records, first.replayed_records) == (1_000, 0)
    rerun = await FencedWriter(client, "totals-sink", 0).write(0, batch)
    assert (rerun.appended_records, rerun.replayed_records) == (0, 1_000)
    next_batch = records("fenced-rerun", 1_000, 10)
    after = await FencedWriter(client, "totals-sink", 0).write(1, next_batch)
    assert after.appended_records == 10
    seen = await values_in(client, "fenced-rerun")
    assert seen == Counter(f"v{i}".encode() for i in range(1_010))
    # Negative control: the same records under another batch id are new to the fence.
    again = await FencedWriter(client, "totals-sink", 0).write(2, batch)
    assert again.appended_records == 1_000
    assert max((await values_in(client, "fenced-rerun")).values()) == 2


async def test_a_run_cut_off_mid_batch_is_completed_by_the_rerun(client: Client) -> None:
    await Admin(client).create_topic("fenced-cut", 2, 3)
    batch = records("fenced-cut", 0, 4_000)
    small = FencedWriterConfig(part_bytes_max=2_048)  # dozens of parts per partition
    writer = FencedWriter(client, "audit", 7, small)
    crashed = asyncio.create_task(writer.write(3, batch))
    await parts_done(writer, 1)
    # Cancelled as its first part is answered: every later part needs a round trip of its own,
    # so only the one part in flight per partition can still land; dozens never will.
    crashed.cancel()  # the task dies between parts, as a killed Spark executor would
    with pytest.raises(asyncio.CancelledError):
        await crashed
    done_before = sum((await values_in(client, "fenced-cut")).values())
    assert 0 < done_before < 4_000
    rerun = await FencedWriter(client, "audit", 7, small).write(3, batch)
    # A part in flight at the cut may have landed since: it counts as replayed, not appended.
    assert rerun.replayed_records >= done_before
    assert rerun.appended_records > 0
    assert rerun.replayed_records + rerun.appended_records == 4_000
    assert await values_in(client, "fenced-cut") == Counter(r.value for r in batch)


async def test_a_fenced_write_rides_out_a_leader_kill(
    client: Client, three_nodes: launcher.LocalCluster
) -> None:
    await Admin(client).create_topic("fenced-kill", 1, 3)
    batch = records("fenced-kill", 0, 6_000)
    small = FencedWriterConfig(part_bytes_max=1_024)  # a few hundred parts, one at a time
    leader = await leader_of(client, "fenced-kill", 0)
    writer = FencedWriter(client, "sink", 0, small)
    writing = asyncio.create_task(writer.write(0, batch))
    await parts_done(writer, 20)  # about 500 records of a few hundred parts, one at a time
    # Killed (kill_and_restart blocks the loop) as the 20th part is answered: the write, one
    # part in flight at a time, is nowhere near its end.
    assert not writing.done()
    restarted = await kill_and_restart(three_nodes, leader)
    report = await asyncio.wait_for(writing, 60)
    assert report.appended_records + report.replayed_records == 6_000
    await wait_ready(restarted)
    assert await values_in(client, "fenced-kill") == Counter(r.value for r in batch)


async def test_every_run_of_a_writer_is_one_producer_and_a_zombie_run_is_fenced(
    client: Client,
) -> None:
    await Admin(client).create_topic("fenced-zombie", 1, 3)
    zombie = FencedWriter(client, "payments", 4)
    await zombie.write(0, records("fenced-zombie", 0, 10))
    successor = FencedWriter(client, "payments", 4)  # Spark re-ran the task: a newer epoch
    await successor.write(1, records("fenced-zombie", 10, 10))
    with pytest.raises(ProducerFencedError):
        await zombie.write(1, records("fenced-zombie", 10, 10))
    consumer = Consumer(client)
    await consumer.assign("fenced-zombie")
    seen: list[ConsumedRecord] = []
    deadline = asyncio.get_running_loop().time() + 30
    while len(seen) < 20:
        seen.extend(await consumer.poll(100))
        assert asyncio.get_running_loop().time() < deadline, "records missing after 30 s"
    # One producer id for the writer (a partition keeps one entry for it), epochs 0 and 1.
    assert {r.producer_id for r in seen} == {seen[0].producer_id}
    assert [r.producer_epoch for r in seen] == [0] * 10 + [1] * 10
    assert [r.sequence for r in seen] == list(range(10)) * 2
