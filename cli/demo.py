"""`raftbroker demo`: the main job, on a real 3-node local cluster in a temporary directory.

An idempotent producer writes payments while the leader of a partition is SIGKILLed twice (and
restarted); everything is then read back and checked: records acknowledged, records in the
log, duplicates, lost, and how long each failover took (kill -> next acknowledged write to that
partition). Two scenes follow on the same cluster: a lost acknowledgement retried as the very
same batch, and a zombie producer fenced by its successor. Exit status 0 only when nothing was
lost or duplicated and both scenes behaved.
"""

from __future__ import annotations

import asyncio
import functools
import signal
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cli.common import LOCAL_CLUSTER_TOML
from cluster import native as p
from cluster.client import (
    Admin,
    Client,
    ClientError,
    Consumer,
    Producer,
    ProducerConfig,
    RecordMetadata,
)
from cluster.local import launcher
from statemachine.records import Record, RecordBatch

TOPIC = "payments"
PARTITIONS = 3
KILLS = 2
SEND_INTERVAL_S = 0.002
QUIET_BEFORE_KILL_S = 1.0


@dataclass(slots=True)
class Failover:
    partition: int
    killed_node: int
    new_leader: int
    resumed_after_s: float


@dataclass(slots=True)
class DemoReport:
    acknowledged: int = 0
    in_log: int = 0
    duplicates: int = 0
    lost: int = 0
    failed_sends: int = 0
    failovers: list[Failover] = field(default_factory=list)
    retry_scene: dict[str, Any] = field(default_factory=dict)  # as --json prints it
    fencing_scene: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return (
            self.lost == 0
            and self.duplicates == 0
            and self.failed_sends == 0
            and len(self.failovers) == KILLS
            and bool(self.retry_scene.get("passed"))
            and bool(self.fencing_scene.get("passed"))
        )

    def as_dict(self) -> dict[str, object]:
        return asdict(self) | {"passed": self.passed}


@dataclass(slots=True)
class _Acks:
    """When each record was sent and acknowledged, per partition."""

    sent: dict[bytes, float] = field(default_factory=dict)
    acked: dict[bytes, RecordMetadata] = field(default_factory=dict)
    acked_at: list[tuple[int, float, float]] = field(default_factory=list)  # (part, sent, acked)
    failed: int = 0


async def run_demo(directory: Path, records: int = 4_000) -> DemoReport:
    started = time.monotonic()
    cluster = launcher.up(directory, 3, LOCAL_CLUSTER_TOML)
    report = DemoReport()
    client = Client(cluster.bootstrap)
    try:
        await launcher.wait_ready(cluster, 30)
        await Admin(client).create_topic(TOPIC, PARTITIONS, 3)
        acks = await _produce_through_failovers(client, cluster, records, report)
        await _verdict(client, acks, report)
        report.retry_scene = await lost_ack_retry_scene(client)
        report.fencing_scene = await zombie_fencing_scene(client)
    finally:
        await client.close()
        launcher.down(cluster.current())
    report.seconds = round(time.monotonic() - started, 1)
    return report


async def _produce_through_failovers(
    client: Client, cluster: launcher.LocalCluster, records: int, report: DemoReport
) -> _Acks:
    acks = _Acks()
    config = ProducerConfig(linger_ms=1, batch_size_bytes=4_096)
    async with Producer(client, config) as producer, asyncio.TaskGroup() as tasks:
        killing = tasks.create_task(_kill_leaders(client, cluster, acks, report))
        i = 0
        while i < records or not killing.done():  # keep writing until every failover is timed
            i += 1
            value = f'{{"payment": {i}, "amount": {i % 97 + 1}}}'.encode()
            acks.sent[value] = time.monotonic()
            future = await producer.send(TOPIC, value)
            future.add_done_callback(functools.partial(_note_ack, acks, value))
            await asyncio.sleep(SEND_INTERVAL_S)  # a steady producer, paced
    return acks


def _note_ack(acks: _Acks, value: bytes, future: asyncio.Future[RecordMetadata]) -> None:
    if future.cancelled() or future.exception() is not None:
        acks.failed += 1
        return
    meta = future.result()
    acks.acked[value] = meta
    acks.acked_at.append((meta.partition, acks.sent[value], time.monotonic()))


async def _kill_leaders(
    client: Client, cluster: launcher.LocalCluster, acks: _Acks, report: DemoReport
) -> None:
    for round_ in range(KILLS):
        await asyncio.sleep(QUIET_BEFORE_KILL_S)
        partition = round_ % PARTITIONS
        victim = await _leader(client, partition)
        node = next(n for n in cluster.nodes if n.node_id == victim)
        launcher.kill(node.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        resumed = await _next_ack_after(acks, partition, killed_at)
        new_leader = await _leader(client, partition)
        report.failovers.append(Failover(partition, victim, new_leader, round(resumed, 3)))
        cluster = launcher.restart_node(cluster.current(), victim)
        await launcher.wait_ready(cluster, 30)


async def _leader(client: Client, partition: int, timeout_s: float = 20) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        meta = await client.refresh([TOPIC])
        leader = meta.topics[0].partitions[partition].leader_id
        if leader >= 0:
            return leader
        await asyncio.sleep(0.05)
    raise TimeoutError(f"no leader for {TOPIC}-{partition}")


async def _next_ack_after(
    acks: _Acks, partition: int, killed_at: float, timeout_s: float = 20
) -> float:
    """Seconds from the kill to the first acknowledgement of a record sent after it."""
    while time.monotonic() < killed_at + timeout_s:
        after = [a for part, s, a in acks.acked_at if part == partition and s >= killed_at]
        if after:
            return min(after) - killed_at
        await asyncio.sleep(0.01)
    raise TimeoutError(f"no write to {TOPIC}-{partition} acknowledged after the kill")


async def _verdict(client: Client, acks: _Acks, report: DemoReport) -> None:
    consumer = Consumer(client)
    await consumer.assign(TOPIC)
    values: list[bytes] = []
    while True:
        batch = await consumer.poll(500)
        if not batch:
            break
        values.extend(r.value or b"" for r in batch)
    counts = Counter(values)
    report.acknowledged = len(acks.acked)
    report.in_log = len(values)
    report.duplicates = sum(n - 1 for n in counts.values() if n > 1)
    report.lost = sum(1 for v in acks.acked if v not in counts)
    report.failed_sends = acks.failed


async def lost_ack_retry_scene(client: Client) -> dict[str, object]:
    """The same batch sent twice, as a producer whose acknowledgement was lost would."""
    init = await client.send_any(p.InitProducerId("", 60_000, -1, -1))
    assert isinstance(init, p.InitProducerIdResponse)
    batch = RecordBatch(init.producer_id, 0, 0, (Record(b"merchant-7", b"refund 120", 1),))
    request = p.Produce(5_000, (p.ProduceEntry(TOPIC, 0, batch.encode()),))
    first = await client.send_to_leader(TOPIC, 0, request)
    retry = await client.send_to_leader(TOPIC, 0, request)
    assert isinstance(first, p.ProduceResponse)
    assert isinstance(retry, p.ProduceResponse)
    a, b = first.results[0], retry.results[0]
    return {
        "first": {"offset": a.base_offset, "duplicate": a.duplicate},
        "retry": {"offset": b.base_offset, "duplicate": b.duplicate},
        "passed": not a.duplicate and b.duplicate and a.base_offset == b.base_offset,
    }


async def zombie_fencing_scene(client: Client) -> dict[str, object]:
    """A producer paused past its successor's start is fenced on its next batch."""
    config = ProducerConfig(transactional_id="settlement-job", linger_ms=0)
    async with Producer(client, config) as zombie:
        await (await zombie.send(TOPIC, b"settlement 1 (instance A)", partition=1))
        async with Producer(client, config) as successor:
            await (await successor.send(TOPIC, b"settlement 1 (instance B)", partition=1))
            try:
                await (await zombie.send(TOPIC, b"settlement 2 (instance A)", partition=1))
                outcome = "accepted"
            except ClientError as exc:
                outcome = exc.error.name
            epochs = {"zombie": zombie.epoch, "successor": successor.epoch}
    return {
        "zombie_write": outcome,
        "epochs": epochs,
        "passed": outcome in ("INVALID_PRODUCER_EPOCH", "PRODUCER_FENCED"),
    }


def demo_in_temporary_directory(records: int = 4_000) -> DemoReport:
    with tempfile.TemporaryDirectory(prefix="raftbroker-demo-") as directory:
        return asyncio.run(run_demo(Path(directory), records))
