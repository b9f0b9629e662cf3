"""raftbroker's latency scenarios (`bench.cluster`'s `Raftbroker.latency` and
`Raftbroker.sequential`).

Role: one partition, linger 0 unless stated. Sequential: each send issued as soon as the
previous one is acknowledged (as `bench.jetstream` publishes), so the rate is 1 / mean latency;
open loop: sends issued every millisecond regardless of acks, the latency under a true 1,000
records/s; then sequential again with the Raft links encrypted. `sequential` is the compared
case alone, what `python -m bench` repeats in rounds; the fsync scenario measures it too.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.harness import VALUE_BYTES, latency_summary_ms, value_of
from bench.nodes import BenchCluster, Settings, create_topic, fresh_cluster, progress
from cluster.client import Producer, ProducerConfig, RecordMetadata

LATENCY_RATE = 1_000
LATENCY_WARMUP_S = 0.5


async def pace(start: float, index: int, rate: float) -> None:
    """Sleep until the `index`th slot of a schedule at `rate` per second (pacing only)."""
    delay = start + index / rate - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


async def sequential_latencies(
    producer: Producer, topic: str, _rate: float, seconds: float
) -> tuple[list[float], float]:
    """Sends for `seconds`, each issued as soon as the previous one is acknowledged."""
    latencies: list[float] = []
    start = time.monotonic()
    index = 0
    while time.monotonic() - start < seconds:
        sent = time.perf_counter()
        await (await producer.send(topic, value_of(index)))
        latencies.append(time.perf_counter() - sent)
        index += 1
    return latencies, len(latencies) / (time.monotonic() - start)


async def open_loop_latencies(
    producer: Producer, topic: str, rate: float, seconds: float
) -> tuple[list[float], float]:
    """Sends issued on the schedule whether or not earlier ones were acknowledged."""
    latencies: list[float] = []

    def acked(sent: float, future: asyncio.Future[RecordMetadata]) -> None:
        if not future.cancelled() and future.exception() is None:
            latencies.append(time.perf_counter() - sent)

    futures = []
    start = time.monotonic()
    for index in range(int(rate * seconds)):
        await pace(start, index, rate)
        future = await producer.send(topic, value_of(index))
        future.add_done_callback(functools.partial(acked, time.perf_counter()))
        futures.append(future)
    rate_achieved = len(futures) / (time.monotonic() - start)
    await asyncio.gather(*futures)
    return latencies, rate_achieved


Measure = Callable[[Producer, str, float, float], Awaitable[tuple[list[float], float]]]


async def latency_case(
    bench: BenchCluster, mode: str, linger_ms: float, seconds: float, mesh: str = "clear"
) -> dict[str, Any]:
    measure: Measure = sequential_latencies if mode == "sequential" else open_loop_latencies
    topic = f"latency-{mode}-l{int(linger_ms * 1000)}us"
    await create_topic(bench, topic, 1)
    async with Producer(bench.client, ProducerConfig(linger_ms=linger_ms)) as producer:
        await measure(producer, topic, LATENCY_RATE, LATENCY_WARMUP_S)
        latencies, rate = await measure(producer, topic, LATENCY_RATE, seconds)
    summary = latency_summary_ms(latencies)
    progress(f"latency: {mode}, linger {linger_ms} ms, links {mesh}: {summary}")
    return {
        "mode": mode,
        "linger_ms": linger_ms,
        "mesh": mesh,
        "records": len(latencies),
        "achieved_rate_per_s": round(rate),
        **summary,
    }


async def latency_scenario(settings: Settings) -> dict[str, Any]:
    cases = []
    async with fresh_cluster() as bench:
        for mode, linger_ms in settings.latency_cases:
            cases.append(await latency_case(bench, mode, linger_ms, settings.latency_s))
    async with fresh_cluster(encrypted=True) as bench:
        cases.append(
            await latency_case(bench, "sequential", 0.0, settings.latency_s, mesh="encrypted")
        )
    params = {
        "target_rate_per_s": LATENCY_RATE,
        "seconds": settings.latency_s,
        "warmup_seconds": LATENCY_WARMUP_S,
        "partitions": 1,
        "value_bytes": VALUE_BYTES,
        "modes": {
            "sequential": "each send awaited before the next is issued (the goal's case)",
            "open_loop": "sends issued on the schedule; latency from send to ack",
        },
        "latency": "from Producer.send to its future's result",
        "mesh": "Raft links in clear (no cluster secret), or encrypted (AES-GCM, with one)",
    }
    return {"latency": {"params": params, "cases": cases}}


async def sequential_scenario(settings: Settings) -> dict[str, Any]:
    """The compared latency case alone (sequential, linger 0, links in clear) on a fresh
    cluster: what `python -m bench` runs again in rounds, alternating with the peer's."""
    async with fresh_cluster() as bench:
        case = await latency_case(bench, "sequential", 0.0, settings.latency_s)
    return {"sequential": case}
