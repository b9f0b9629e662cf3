"""Merchant settlement events: the running example of the idempotent-producer literature.

An event is a JSON object `{"event_id", "merchant_id", "amount_cents", "currency", "ts_ms"}`
keyed by its merchant id (so one merchant's events stay in order in one partition). `generate`
sends them through the idempotent producer at a steady rate; amounts and merchants come from a
seeded generator, so a run can be repeated and its totals computed independently
(`expected_totals`).

No Spark here: the generator is what `raftbroker pipeline generate` runs.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from cluster.client import Client, Producer, ProducerConfig
from cluster.clock import wall_ms

CURRENCY = "EUR"


@dataclass(frozen=True, slots=True)
class Settlement:
    event_id: str
    merchant_id: str
    amount_cents: int

    def encode(self, ts_ms: int) -> bytes:
        return json.dumps(
            {
                "event_id": self.event_id,
                "merchant_id": self.merchant_id,
                "amount_cents": self.amount_cents,
                "currency": CURRENCY,
                "ts_ms": ts_ms,
            },
            separators=(",", ":"),
        ).encode()


def settlements(count: int, merchants: int, seed: int) -> Iterator[Settlement]:
    rng = random.Random(seed)
    for i in range(count):
        merchant = f"m{rng.randrange(merchants):04d}"
        yield Settlement(f"s{seed}-{i:09d}", merchant, rng.randrange(100, 100_000))


def expected_totals(count: int, merchants: int, seed: int) -> dict[str, tuple[int, int]]:
    """merchant -> (total cents, events): what a correct job must report for a generated run."""
    totals: Counter[str] = Counter()
    events: Counter[str] = Counter()
    for s in settlements(count, merchants, seed):
        totals[s.merchant_id] += s.amount_cents
        events[s.merchant_id] += 1
    return {m: (totals[m], events[m]) for m in totals}


async def generate(
    cluster: Client, topic: str, count: int, *, rate_per_s: float, merchants: int, seed: int
) -> int:
    """Send `count` events at `rate_per_s` (0: as fast as acknowledged); how many were sent."""
    start = time.monotonic()
    async with Producer(cluster, ProducerConfig(linger_ms=5)) as producer:
        futures = []
        for i, s in enumerate(settlements(count, merchants, seed)):
            if rate_per_s > 0:
                delay = start + i / rate_per_s - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)  # pacing, not synchronisation
            ts_ms = wall_ms()
            futures.append(await producer.send(topic, s.encode(ts_ms), key=s.merchant_id.encode()))
        await asyncio.gather(*futures)
    return len(futures)
