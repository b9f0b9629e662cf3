"""raftbroker's failover scenario (`bench.cluster`'s `Raftbroker.failover`).

Role: a record every 2 ms on one partition, awaited through the Producer's own retries; SIGKILL
of the partition leader, then the time to the first ack of a send issued after the kill, and to
the first survivor that reports leading the group; the node is restarted and waited for until
it has applied the group's commit index; `failover_kills` times. Then the topic is read back:
acknowledged records absent and values present twice must both be 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bench.cluster_throughput import read_back
from bench.harness import poll_until, value_of
from bench.nodes import REPLICATION, BenchCluster, Settings, create_topic, fresh_cluster, progress
from cluster import native as p
from cluster.client import Admin, ClientError, Producer, RecordMetadata
from cluster.local import launcher

FAILOVER_INTERVAL_S = 0.002
STEADY_BEFORE_KILL_S = 1.0
RESUME_TIMEOUT_S = 30.0
ELECTION_POLL_S = 0.01


@dataclass(slots=True)
class SteadyLoad:
    """Records issued at a steady pace: when each was issued and when its ack arrived."""

    sent_at: list[float] = field(default_factory=list)
    futures: list[asyncio.Future[RecordMetadata]] = field(default_factory=list)
    acked_at: dict[int, float] = field(default_factory=dict)
    kill_at: float = float("inf")
    first_ack_after_kill: float | None = None

    def on_done(self, index: int, future: asyncio.Future[RecordMetadata]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        now = time.monotonic()
        self.acked_at[index] = now
        if self.first_ack_after_kill is None and self.sent_at[index] > self.kill_at:
            self.first_ack_after_kill = now

    def mark_kill(self) -> None:
        self.first_ack_after_kill = None
        self.kill_at = time.monotonic()


async def steady_producer(
    producer: Producer, topic: str, load: SteadyLoad, stop: asyncio.Event
) -> None:
    """Issue a record every FAILOVER_INTERVAL_S (no catching up after a stall) until `stop`."""
    next_at = time.monotonic()
    while not stop.is_set():
        delay = next_at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)  # pacing, not synchronisation
        next_at = max(next_at + FAILOVER_INTERVAL_S, time.monotonic())
        index = len(load.sent_at)
        load.sent_at.append(time.monotonic())
        future = await producer.send(topic, value_of(index))
        load.futures.append(future)
        future.add_done_callback(functools.partial(load.on_done, index))


async def group_statuses(bench: BenchCluster, group: str) -> dict[int, p.RaftGroupReport]:
    """Each node's view of one Raft group, for the nodes that answer and know the group."""
    views = {}
    for node in bench.local.nodes:
        with contextlib.suppress(ClientError):
            status = await Admin(bench.client).cluster_status(node.client_address)
            for view in status.groups:
                if view.group == group:
                    views[node.node_id] = view
    return views


async def serving_leader(bench: BenchCluster, topic: str) -> tuple[int, int]:
    """(leader node id, controller node id) once the leader itself says it leads the group."""
    found: list[int] = []

    async def leads() -> bool:
        meta = await bench.client.refresh([topic])
        leader = meta.topics[0].partitions[0].leader_id
        if leader < 0:
            return False
        address = bench.node(leader).client_address
        status = await Admin(bench.client).cluster_status(address)
        if any(g.group == f"{topic}-0" and g.is_leader for g in status.groups):
            found[:] = [leader, meta.controller_id]
            return True
        return False

    await poll_until(leads, f"{topic}: a serving leader")
    return found[0], found[1]


async def wait_caught_up(bench: BenchCluster, node_id: int, group: str) -> float:
    """Seconds until a restarted node serves requests and has applied its group's commit."""
    target: list[int] = []

    async def caught_up() -> bool:
        views = await group_statuses(bench, group)
        leader = next((v for v in views.values() if v.is_leader), None)
        if leader is None:
            return False
        target[:1] = target[:1] or [leader.commit_index]
        mine = views.get(node_id)
        return mine is not None and mine.leader_id >= 0 and mine.last_applied >= target[0]

    return await poll_until(caught_up, f"node {node_id} caught up on {group}")


async def elected_after(bench: BenchCluster, group: str, dead: int, since: float) -> float:
    """Seconds from `since` until a surviving node reports that it leads `group`."""
    survivors = [n for n in bench.local.nodes if n.node_id != dead]
    found: list[float] = []

    async def elected() -> bool:
        for node in survivors:
            status = await Admin(bench.client).cluster_status(node.client_address)
            if any(g.group == group and g.is_leader for g in status.groups):
                found.append(time.monotonic() - since)
                return True
        return False

    await poll_until(elected, f"{group}: a new leader", RESUME_TIMEOUT_S, ELECTION_POLL_S)
    return found[0]


async def kill_leader_once(bench: BenchCluster, topic: str, load: SteadyLoad) -> dict[str, Any]:
    """SIGKILL the partition leader, time the resume, restart the node, wait until caught up."""
    await asyncio.sleep(STEADY_BEFORE_KILL_S)  # steady load before the kill, not a sync
    group = f"{topic}-0"
    leader, controller = await serving_leader(bench, topic)
    load.mark_kill()
    launcher.kill(bench.node(leader).pid, signal.SIGKILL)
    elected_s = await elected_after(bench, group, leader, load.kill_at)

    async def resumed() -> bool:
        return load.first_ack_after_kill is not None

    await poll_until(resumed, "first ack after the kill", RESUME_TIMEOUT_S, ELECTION_POLL_S)
    assert load.first_ack_after_kill is not None
    resume_s = load.first_ack_after_kill - load.kill_at
    new_leader, _ = await serving_leader(bench, topic)
    bench.local = launcher.restart_node(bench.local, leader)
    rejoin_s = await wait_caught_up(bench, leader, group)
    progress(f"failover: killed node {leader}, resumed in {resume_s * 1000:.0f} ms")
    return {
        "killed_node": leader,
        "killed_was_controller": leader == controller,
        "new_leader": new_leader,
        "new_leader_seen_ms": round(elected_s * 1000, 1),
        "resume_ms": round(resume_s * 1000, 1),
        "restart_to_caught_up_s": round(rejoin_s, 2),
    }


def check_delivery(load: SteadyLoad, values: Counter[bytes]) -> dict[str, int]:
    """Acknowledged records absent from the log, and values present more than once."""
    acked = {value_of(i) for i in load.acked_at}
    failed = len(load.futures) - len(load.acked_at)
    return {
        "sent": len(load.futures),
        "acked": len(acked),
        "failed_sends": failed,
        "read_back": sum(values.values()),
        "lost": len(acked - values.keys()),
        "duplicated": sum(1 for count in values.values() if count > 1),
    }


async def kills_under_load(
    bench: BenchCluster, topic: str, count: int
) -> tuple[SteadyLoad, list[dict[str, Any]]]:
    """`count` leader kills under a steady producer; every send settled at the end."""
    load = SteadyLoad()
    stop = asyncio.Event()
    kills = []
    async with Producer(bench.client) as producer:
        task = asyncio.create_task(steady_producer(producer, topic, load, stop))
        try:
            for _ in range(count):
                kills.append(await kill_leader_once(bench, topic, load))
        finally:
            stop.set()
            await task
        await asyncio.gather(*load.futures, return_exceptions=True)
    return load, kills


def failover_params(settings: Settings) -> dict[str, Any]:
    return {
        "partitions": 1,
        "replication": REPLICATION,
        "send_interval_ms": FAILOVER_INTERVAL_S * 1000,
        "kills": settings.failover_kills,
        "signal": "SIGKILL of the partition leader's process",
        "steady_load_before_each_kill_s": STEADY_BEFORE_KILL_S,
        "producer": "idempotent, default ProducerConfig (its own retries)",
        "resume": "kill -> first ack of a send issued after the kill",
        "new_leader_seen": "kill -> a survivor's ClusterStatus says it leads (polled every 10 ms)",
    }


async def failover_scenario(settings: Settings) -> dict[str, Any]:
    topic = "failover"
    async with fresh_cluster() as bench:
        await create_topic(bench, topic, 1)
        load, kills = await kills_under_load(bench, topic, settings.failover_kills)
        values: Counter[bytes] = Counter()
        await read_back(bench, topic, lambda rs: values.update(r.value or b"" for r in rs))
    resumes = [k["resume_ms"] for k in kills]
    return {
        "failover": {
            "params": failover_params(settings),
            "kills": kills,
            "resume_median_ms": round(statistics.median(resumes), 1),
            "resume_max_ms": max(resumes),
            "delivery": check_delivery(load, values),
        }
    }
