"""raftbroker's floors: the baseline and idle scenarios (`bench.cluster`'s `Raftbroker.baseline`
and `Raftbroker.idle`, which JetStream's side has no counterpart of).

Role: what the other figures stand on. baseline: asyncio TCP round trips on loopback (the
floor of any request's latency, to a peer process and within this loop) and `bench.apply`'s
quick mode (one replica's apply rate). idle: CPU % of each node over an idle period with no
partitions, then with 16 partitions: what a partition group costs while nothing happens.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from bench import apply as apply_bench
from bench.harness import (
    READY_TIMEOUT_S,
    VALUE_BYTES,
    cpu_report,
    latency_summary_ms,
    sample_cpu,
    value_of,
)
from bench.nodes import NODES, REPLICATION, BenchCluster, Settings, create_topic, fresh_cluster
from cluster.local import launcher

# idle: after the groups all have leaders, let start-up work (first ticks, noops) pass
IDLE_GRACE_S = 1.0
IDLE_PARTITIONS = 16


# -- idle -----------------------------------------------------------------------------------------


async def idle_cpu(bench: BenchCluster, seconds: float) -> dict[str, Any]:
    await asyncio.sleep(IDLE_GRACE_S)  # start-up work passes; not a synchronisation
    before = sample_cpu(bench.node_pids())
    await asyncio.sleep(seconds)  # the measurement itself: nothing happens
    return cpu_report(before, sample_cpu(bench.node_pids()))


def per_group_increment(zero: dict[str, Any], loaded: dict[str, Any]) -> dict[str, float]:
    """CPU % per partition group (one replica) that each node pays while idle."""
    return {
        name: round((loaded[name]["cpu_percent"] - zero[name]["cpu_percent"]) / IDLE_PARTITIONS, 3)
        for name in (*(f"node{i + 1}" for i in range(NODES)), "total")
    }


async def idle_scenario(settings: Settings) -> dict[str, Any]:
    async with fresh_cluster() as bench:
        zero = await idle_cpu(bench, settings.idle_s)
        await create_topic(bench, "idle", IDLE_PARTITIONS)
        loaded = await idle_cpu(bench, settings.idle_s)
    params = {
        "seconds": settings.idle_s,
        "grace_s": IDLE_GRACE_S,
        "replication": REPLICATION,
        "partitions": [0, IDLE_PARTITIONS],
        "cpu_percent": "of one core",
    }
    return {
        "idle": {
            "params": params,
            "partitions_0": zero,
            f"partitions_{IDLE_PARTITIONS}": loaded,
            "cpu_percent_per_partition_group": per_group_increment(zero, loaded),
        }
    }


# -- baselines ------------------------------------------------------------------------------------


ECHO_SERVER = """
import asyncio, sys
from cli.common import run
async def echo(reader, writer):
    while data := await reader.read(65536):
        writer.write(data)
    writer.close()
async def main():
    server = await asyncio.start_server(echo, sys.argv[1], 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
run(main())
"""


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65_536):
        writer.write(data)
    writer.close()


async def round_trip_times(host: str, port: int, count: int) -> dict[str, float]:
    """Sequential 100-byte echoes: the latency summary, after a tenth as warm-up."""
    reader, writer = await asyncio.open_connection(host, port)
    message = value_of(0)
    times = []
    try:
        for _ in range(count + count // 10):
            start = time.perf_counter()
            writer.write(message)
            await reader.readexactly(len(message))
            times.append(time.perf_counter() - start)
    finally:
        writer.close()
    return latency_summary_ms(times[count // 10 :])


async def tcp_round_trips_in_process(count: int) -> dict[str, Any]:
    server = await asyncio.start_server(echo, launcher.host_of(0), 0)
    try:
        port = server.sockets[0].getsockname()[1]
        summary = await round_trip_times(launcher.host_of(0), port, count)
    finally:
        server.close()
        await server.wait_closed()
    return {"what": "echo server on this process's event loop", **summary}


async def tcp_round_trips_cross_process(count: int) -> dict[str, Any]:
    host = launcher.host_of(0)
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-c", ECHO_SERVER, host, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert server.stdout is not None
        port = int(await asyncio.wait_for(server.stdout.readline(), READY_TIMEOUT_S))
        summary = await round_trip_times(host, port, count)
    finally:
        launcher.kill(server.pid)
        await server.wait()
    return {"what": "echo server in another Python process (asyncio, uvloop)", **summary}


async def tcp_round_trips(count: int) -> dict[str, Any]:
    """The floor of a request's latency: a loopback TCP round trip between asyncio peers."""
    return {
        "message_bytes": VALUE_BYTES,
        "round_trips": count,
        "cross_process": await tcp_round_trips_cross_process(count),
        "in_process": await tcp_round_trips_in_process(count),
    }


def apply_baseline(seconds: float) -> dict[str, Any]:
    report = apply_bench.run(seconds, quick=True)
    return {
        "what": "bench.apply --quick: one replica's PartitionStateMachine.apply, one thread",
        "seconds_per_run": seconds,
        "cases": [
            {k: c[k] for k in ("records_per_batch", "batches_per_s", "records_per_s")}
            for c in report["cases"]
        ],
    }


async def baseline_scenario(settings: Settings) -> dict[str, Any]:
    return {
        "baseline": {
            "tcp_round_trip": await tcp_round_trips(settings.tcp_round_trips),
            "apply": apply_baseline(settings.apply_seconds),
        }
    }
