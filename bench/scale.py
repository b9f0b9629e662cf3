"""Partition scale (issue 38's benchmark): what partitions cost a raftbroker cluster while idle,
how fast they are created, and how fast a dead node's partitions fail over.

Role: `python -m bench.scale [--quick] [--partitions 200,1000] [--out FILE]`; one JSON object
on stdout (progress on stderr), exit status 1 if a case failed (a goal missed is a result).
For each partition count, on a fresh 3-node cluster (`bench.nodes.fresh_cluster`: replication
3, fsync off as the other raftbroker scenarios):
- create: one topic of N partitions, timed from the CreateTopic call until every partition
  acknowledged a produce (one record each, the client library's producer);
- idle: once the cluster settled (`bench.kafka_idle.settle`), over `idle_s`: CPU of the three
  nodes together (% of one core), the Raft groups' messages per node pair per second (each
  pair's messages both ways, from the nodes' `raftbroker_raft_messages_total`), the elections
  (partitions whose term moved), and each node's resident memory;
- failover: SIGKILL of the node leading the most partitions, then one produce to each of its
  partitions at once: the time until each was acknowledged by a new leader (max and median),
  and how many of the other partitions changed term meanwhile (needless elections).

Goals (issue 38, at 1,000 partitions): idle CPU <= 10% of one core; messages per node pair per
second no higher than at 200 (the same, within `PAIR_RATE_SLACK`); created in <= 5 s; every
partition of the killed node acknowledged within 3 s; no survivor's partition re-elected.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import signal
import statistics
import sys
import time
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.harness import (
    cpu_report,
    emit,
    load_average,
    memory_mb,
    reporter,
    run_header,
    run_loop,
    sample_cpu,
    value_of,
)
from bench.kafka_idle import settle
from bench.nodes import REPLICATION, BenchCluster, fresh_cluster
from cluster.client import Admin, Producer
from cluster.local import launcher

TOPIC = "scale"
CREATE_TIMEOUT_S = 300.0
FAILOVER_TIMEOUT_S = 120.0
METRICS_TIMEOUT_S = 10.0
PAIR_RATE_SLACK = 1.2  # "the same" messages per node pair at 1,000 partitions as at 200
GOALS = {
    "idle_cpu_percent_max": 10.0,
    "create_s_max": 5.0,
    "failover_max_s_max": 3.0,
    "survivor_elections_max": 0,
}
_MESSAGES = re.compile(
    r'^raftbroker_raft_messages_total\{direction="(sent|received)",peer="([^"]+)"\} ([\d.e+]+)$',
    re.MULTILINE,
)

progress = reporter("bench.scale")


@dataclass(frozen=True, slots=True)
class Settings:
    quick: bool
    partitions: tuple[int, ...]
    idle_s: float

    @classmethod
    def of(cls, quick: bool, partitions: tuple[int, ...] | None) -> Settings:
        default = (20,) if quick else (200, 1_000)
        return cls(quick, partitions or default, 3.0 if quick else 60.0)


def messages_sent(bench: BenchCluster) -> dict[tuple[str, str], float]:
    """(sender, receiver) -> the groups' messages the sender sent the receiver so far, by
    Raft address (each node's /metrics)."""
    sent = {}
    for node in bench.local.nodes:
        url = f"http://{node.host}:{node.http_port}/metrics"
        with urllib.request.urlopen(url, timeout=METRICS_TIMEOUT_S) as answer:
            text = answer.read().decode()
        me = f"{node.host}:{node.raft_port}"
        for direction, peer, count in _MESSAGES.findall(text):
            if direction == "sent":
                sent[(me, peer)] = float(count)
    return sent


def pair_rates(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float],
               seconds: float) -> dict[str, float]:  # fmt: skip
    """Messages per second between each node pair, both ways together."""
    pairs: dict[str, float] = {}
    for (sender, receiver), count in after.items():
        key = " - ".join(sorted((sender, receiver)))
        pairs[key] = pairs.get(key, 0.0) + (count - before.get((sender, receiver), 0.0))
    return {key: round(total / seconds, 1) for key, total in sorted(pairs.items())}


async def terms(bench: BenchCluster) -> dict[int, tuple[int, int]]:
    """Each partition's (leader node, term), as the metadata tells it."""
    meta = await bench.client.refresh([TOPIC])
    return {pm.partition: (pm.leader_id, pm.term) for pm in meta.topics[0].partitions}


async def produce_to_each(
    bench: BenchCluster, partitions: list[int], timeout_s: float
) -> dict[int, float]:
    """One record to each partition at once; the seconds until each was acknowledged, for
    those acknowledged within `timeout_s`."""
    start = time.monotonic()
    acked: dict[int, float] = {}
    async with Producer(bench.client) as producer:

        async def one(partition: int) -> None:
            await (await producer.send(TOPIC, value_of(partition), partition=partition))
            acked[partition] = time.monotonic() - start

        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await asyncio.gather(*(one(n) for n in partitions))
    return acked


async def create_case(bench: BenchCluster, partitions: int) -> dict[str, Any]:
    start = time.monotonic()
    await Admin(bench.client).create_topic(TOPIC, partitions, REPLICATION)
    created_s = time.monotonic() - start
    acked = await produce_to_each(bench, list(range(partitions)), CREATE_TIMEOUT_S)
    if len(acked) < partitions:
        raise TimeoutError(f"{partitions - len(acked)} partitions unacknowledged after creation")
    return {"metadata_s": round(created_s, 2), "create_s": round(time.monotonic() - start, 2)}


async def idle_case(bench: BenchCluster, idle_s: float) -> dict[str, Any]:
    settled_s, settled = await settle(bench.node_pids)
    terms_before = await terms(bench)
    sent_before = await asyncio.to_thread(messages_sent, bench)
    cpu_before = sample_cpu(bench.node_pids())
    await asyncio.sleep(idle_s)  # the measurement window itself: nothing happens
    cpu = cpu_report(cpu_before, sample_cpu(bench.node_pids()))
    rates = pair_rates(sent_before, await asyncio.to_thread(messages_sent, bench), idle_s)
    terms_after = await terms(bench)
    return {
        "settle_s": round(settled_s, 1),
        "settled": settled,
        "seconds": idle_s,
        "cpu_percent_total": cpu["total"]["cpu_percent"],
        "cpu": cpu,
        "messages_per_pair_per_s": rates,
        "messages_per_pair_per_s_max": max(rates.values(), default=0.0),
        "elections": sum(terms_after[n][1] != t for n, (_, t) in terms_before.items()),
        "memory": memory_mb(bench.node_pids()),
    }


async def failover_case(bench: BenchCluster) -> dict[str, Any]:
    before = await terms(bench)
    leaders = [leader for leader, _ in before.values()]
    victim = max(set(leaders), key=leaders.count)
    theirs = [n for n, (leader, _) in before.items() if leader == victim]
    progress(f"failover: SIGKILL of node {victim}, leader of {len(theirs)} partitions")
    launcher.kill(bench.node(victim).pid, signal.SIGKILL)
    acked = await produce_to_each(bench, theirs, FAILOVER_TIMEOUT_S)
    after = await terms(bench)
    times = sorted(acked.values())
    unacked = len(theirs) - len(acked)
    return {
        "killed_node": victim,
        "partitions_led": len(theirs),
        # Not acknowledged within FAILOVER_TIMEOUT_S: the max is then that timeout.
        "unacknowledged": unacked,
        "max_s": FAILOVER_TIMEOUT_S if unacked else round(times[-1], 2),
        "median_s": round(statistics.median(times), 2) if times else None,
        "survivor_elections": sum(
            after[n][1] != term for n, (leader, term) in before.items() if leader != victim
        ),
    }


async def run_count(partitions: int, settings: Settings) -> dict[str, Any]:
    async with fresh_cluster() as bench:
        progress(f"{partitions} partitions: create")
        report = {"create": await create_case(bench, partitions)}
        progress(f"{partitions} partitions: settle, then idle for {settings.idle_s:g} s")
        report["idle"] = await idle_case(bench, settings.idle_s)
        report["failover"] = await failover_case(bench)
    return report


def goals(by_count: dict[str, Any]) -> dict[str, Any]:
    """Issue 38's goals at the largest count measured (the pair rate against the smallest)."""
    if not by_count:
        return {}
    counts = sorted(by_count, key=int)
    top, low = by_count[counts[-1]], by_count[counts[0]]
    rate_top = top["idle"]["messages_per_pair_per_s_max"]
    rate_low = low["idle"]["messages_per_pair_per_s_max"]
    return {
        "at_partitions": int(counts[-1]),
        "idle_cpu_percent": top["idle"]["cpu_percent_total"],
        "idle_cpu_met": top["idle"]["cpu_percent_total"] <= GOALS["idle_cpu_percent_max"],
        "pair_rate_ratio": round(rate_top / rate_low, 2) if rate_low else None,
        "pair_rate_met": bool(rate_low) and rate_top <= PAIR_RATE_SLACK * rate_low,
        "create_s": top["create"]["create_s"],
        "create_met": top["create"]["create_s"] <= GOALS["create_s_max"],
        "failover_max_s": top["failover"]["max_s"],
        "failover_met": top["failover"]["max_s"] <= GOALS["failover_max_s_max"],
        "survivor_elections": top["failover"]["survivor_elections"],
        "survivor_elections_met": top["failover"]["survivor_elections"]
        <= GOALS["survivor_elections_max"],
    }


async def run(settings: Settings) -> dict[str, Any]:
    started, load = datetime.now(UTC), load_average()
    by_count: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for count in settings.partitions:
        try:
            by_count[str(count)] = await run_count(count, settings)
        except Exception as exc:  # noqa: BLE001 - reported; the other counts still run
            errors[str(count)] = repr(exc)
    return {
        **run_header(started, load),
        "quick": settings.quick,
        "partitions": by_count,
        "goals": goals(by_count),
        "errors": errors,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="20 partitions, seconds (CI)")
    parser.add_argument("--partitions", help="comma-separated counts (default 200,1000)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    counts = tuple(int(c) for c in args.partitions.split(",")) if args.partitions else None
    report = run_loop(run(Settings.of(args.quick, counts)))
    return emit(report, args.out)


if __name__ == "__main__":
    sys.exit(main())
