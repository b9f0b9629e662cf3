"""An idle cluster holding many partitions, on either broker: CPU and resident memory per node.

Role: issue 36's idle measure, called by `bench.kafka`'s idle case on a fresh cluster of either
broker. One topic of `partitions` partitions (replication 3) is created, and nothing is sent.
Creating it leaves each cluster busy for a while (Apache Kafka creates every replica's log and
its followers start fetching, which took it about 15 s at 1,000 partitions here; raftbroker's
groups elect and send their first heartbeats), so CPU is sampled in windows of
`SETTLE_WINDOW_S` until one is within `SETTLE_RATIO` of the one before (or `SETTLE_TIMEOUT_S`
passed: then the report says it had not settled), and only then measured, over `IDLE_S`.
Resident memory is read at the end. The goal (idle CPU <= 1.0x of Kafka's) waits for the
partition-scale issue; the figure is reported now.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.harness import cpu_report, memory_mb, sample_cpu

SETTLE_WINDOW_S = 5.0
SETTLE_RATIO = 0.25  # a window within 25% of the one before: settled
SETTLE_TIMEOUT_S = 120.0
IDLE_S = 10.0


async def total_cpu_percent(pids: Callable[[], dict[str, int]], seconds: float) -> float:
    before = sample_cpu(pids())
    await asyncio.sleep(seconds)  # the measurement window itself
    report = cpu_report(before, sample_cpu(pids()))
    percent: float = report["total"]["cpu_percent"]
    return percent


async def settle(pids: Callable[[], dict[str, int]]) -> tuple[float, bool]:
    """Windows of CPU until two in a row agree; (seconds it took, whether they did)."""
    start = time.monotonic()
    last = await total_cpu_percent(pids, SETTLE_WINDOW_S)
    while time.monotonic() - start < SETTLE_TIMEOUT_S:
        now = await total_cpu_percent(pids, SETTLE_WINDOW_S)
        if abs(now - last) <= SETTLE_RATIO * max(last, 1.0):
            return time.monotonic() - start, True
        last = now
    return time.monotonic() - start, False


async def idle(
    create_topic: Callable[[str, int], Awaitable[None]],
    pids: Callable[[], dict[str, int]],
    partitions: int,
) -> dict[str, Any]:
    """Create the topic, let the cluster settle, measure; the report."""
    start = time.monotonic()
    await create_topic("idle", partitions)
    created_s = time.monotonic() - start
    settled_s, settled = await settle(pids)
    before = sample_cpu(pids())
    await asyncio.sleep(IDLE_S)  # the measurement itself: nothing happens
    cpu = cpu_report(before, sample_cpu(pids()))
    return {
        "partitions": partitions,
        "replication": 3,
        "create_s": round(created_s, 1),
        "settle_s": round(settled_s, 1),
        "settled": settled,
        "seconds": IDLE_S,
        "cpu": cpu,
        "cpu_percent_total": cpu["total"]["cpu_percent"],
        "memory": memory_mb(pids()),
    }
