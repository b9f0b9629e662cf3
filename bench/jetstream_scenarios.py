"""JetStream's scenarios (`bench.jetstream`'s `JetStream`, the `Side` of `bench.side`).

Role: the workload `bench.cluster` runs on raftbroker, run on NATS JetStream through nats-py:
sequential publishes from a client on the stream leader's server (compared) and on a
follower's; pipelined `publish_async` with a deep window, then the stream read back by a pull
consumer and an ordered push consumer (consume); leader kills under a steady, retried load
(failover); and sequential and pipelined publishes against servers that fsync every message.
Every publish carries a unique `Nats-Msg-Id` and waits for its PubAck. `pipelined_load` and the
steady publisher also fill and feed `bench.groups`' JetStream cases.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import nats
import nats.errors
from nats.js import api as js_api

from bench.harness import (
    VALUE_BYTES,
    cpu_report,
    latency_summary_ms,
    poll_until,
    sample_cpu,
    value_of,
)
from bench.jetstream_servers import (
    ASYNC_WINDOW,
    READY_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    STREAM,
    SUBJECT,
    JetStreamCluster,
    Server,
    Settings,
    connection_error,
    fresh_cluster,
    nats_versions,
    progress,
    publish_acked,
    wait_group,
)

STEADY_BEFORE_KILL_S = 1.0
FETCH_BATCH = 1_000
CONSUME_TIMEOUT_S = 120.0


async def sequential_scenario(settings: Settings, *, via_follower: bool = True) -> dict[str, Any]:
    """From a client on the stream leader's server (the compared case), then, `via_follower`,
    on a follower's. Without it, the compared case alone: what `python -m bench` runs again in
    rounds, alternating with raftbroker's (`sequential_on_leader`)."""
    mode = "each publish awaited before the next"
    async with fresh_cluster() as cluster:
        group = await wait_group(cluster, lambda g: g.leader is not None, "a stream leader")
        leader = cluster.by_name(str(group.leader))
        on_leader = await sequential_through(cluster, leader, settings.sequential_s, 1_000_000)
        report = {
            "sequential": {"mode": mode, "client_on": "the stream leader's server", **on_leader}
        }
        if via_follower:
            follower = next(s for s in cluster.servers if s is not leader)
            through = await sequential_through(cluster, follower, settings.sequential_s, 2_000_000)
            report["sequential_via_follower"] = {
                "mode": mode,
                "client_on": "a follower's server (the publish and its ack cross one more hop)",
                **through,
            }
    return report


async def sequential_through(
    cluster: JetStreamCluster, server: Server, seconds: float, first_index: int
) -> dict[str, Any]:
    """Sequential publishes from a client connected to `server` alone: where a client
    connects decides whether its publish reaches the stream's leader directly."""
    nc = await nats.connect(
        servers=[f"nats://{server.host}:{cluster.client_port}"],
        connect_timeout=2,
        allow_reconnect=False,
        error_cb=connection_error,
    )
    try:
        js = nc.jetstream(timeout=REQUEST_TIMEOUT_S)
        latencies: list[float] = []
        end = time.monotonic() + seconds
        index = first_index
        while time.monotonic() < end:
            start = time.perf_counter()
            await publish_acked(js, index)
            latencies.append(time.perf_counter() - start)
            index += 1
    finally:
        await asyncio.wait_for(nc.close(), 5)
    return {
        "seconds": seconds,
        "messages": len(latencies),
        "rate_per_s": round(len(latencies) / seconds),
        **latency_summary_ms(latencies),
    }


async def pipelined_load(
    cluster: JetStreamCluster, ramp_s: float, seconds: float
) -> dict[str, Any]:
    """publish_async as fast as the window allows; acks and CPU counted in a timed window."""
    js = cluster.js
    acked = 0
    index = 0
    pending: set[asyncio.Future[Any]] = set()

    def done(future: asyncio.Future[Any]) -> None:
        nonlocal acked
        pending.discard(future)
        if not future.cancelled() and future.exception() is None:
            acked += 1

    pids = {**cluster.pids(), "client": os.getpid()}
    start = time.monotonic()
    window_start = start + ramp_s
    before = None
    acked_at_start = 0
    # The wait for window space has no deadline (the futures have no timer of their own), so
    # one deadline bounds the loop: a stalled cluster fails the scenario instead of hanging it.
    # Not publish_async's wait_stall: its wait_for makes a task per publish, which yields to
    # the loop every message, so nats-py flushes tiny writes: half the rate, in trials here.
    async with asyncio.timeout(ramp_s + seconds + REQUEST_TIMEOUT_S):
        while time.monotonic() < window_start + seconds:
            if before is None and time.monotonic() >= window_start:
                before, acked_at_start = sample_cpu(pids), acked
            future = await js.publish_async(
                SUBJECT, value_of(index), headers={"Nats-Msg-Id": f"p{index}"}
            )
            future.add_done_callback(done)
            pending.add(future)
            index += 1
    after, acked_in_window = sample_cpu(pids), acked - acked_at_start
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(js.publish_async_completed(), 30)
    assert before is not None
    rate = acked_in_window / seconds
    return {
        "mode": f"publish_async, up to {ASYNC_WINDOW} pending",
        "seconds": seconds,
        "acked_in_window": acked_in_window,
        "msgs_per_s": round(rate),
        "mb_per_s": round(rate * VALUE_BYTES / 1e6, 2),
        "sent_in_total": index,
        "acked_in_total": acked,
        "cpu": cpu_report(before, after),
    }


def ignore_batch(_msgs: list[Any]) -> None:
    return None


async def pull_read(
    cluster: JetStreamCluster,
    expected: int,
    timeout_s: float,
    on_batch: Callable[[list[Any]], None] = ignore_batch,
) -> int:
    """The stream from the start through one pull consumer (ephemeral, AckNone: like a Kafka
    consumer, no ack per message), `on_batch` called per fetched batch; messages read."""
    config = js_api.ConsumerConfig(
        ack_policy=js_api.AckPolicy.NONE, deliver_policy=js_api.DeliverPolicy.ALL
    )
    sub = await cluster.js.pull_subscribe("bench.>", config=config)
    deadline = time.monotonic() + timeout_s
    count = 0
    try:
        while count < expected and time.monotonic() < deadline:
            try:
                msgs = await sub.fetch(FETCH_BATCH, timeout=1.0)
            except nats.errors.TimeoutError:
                continue
            on_batch(msgs)
            count += len(msgs)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(sub.unsubscribe(), 5)
    return count


async def ordered_push_read(cluster: JetStreamCluster, expected: int, timeout_s: float) -> int:
    """The stream from the start through an ordered push consumer (ephemeral, AckNone, flow
    controlled: nats-py's path for reading a whole stream); messages read."""
    count = 0
    done = asyncio.Event()

    async def on_msg(_msg: Any) -> None:
        nonlocal count
        count += 1
        if count >= expected:
            done.set()

    sub = await cluster.js.subscribe("bench.>", cb=on_msg, ordered_consumer=True)
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout_s)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(sub.unsubscribe(), 5)
    return count


async def read_values(cluster: JetStreamCluster, timeout_s: float) -> Counter[bytes]:
    """Every value in the stream, counted (for lost and duplicated messages)."""
    info = await cluster.js.stream_info(STREAM)
    values: Counter[bytes] = Counter()
    await pull_read(
        cluster,
        int(info.state.messages),
        timeout_s,
        lambda msgs: values.update(m.data for m in msgs),
    )
    return values


Reader = Callable[[JetStreamCluster, int, float], Awaitable[int]]
# (label, reader): the mode the comparison reports first, then nats-py's faster path
READERS: dict[str, tuple[str, Reader]] = {
    "pull_fetch": (f"one pull consumer, AckNone, fetch batches of {FETCH_BATCH}", pull_read),
    "ordered_push": (
        "one ordered push consumer (AckNone, flow control), a callback",
        ordered_push_read,
    ),
}


async def consume_case(cluster: JetStreamCluster, mode: str, expected: int) -> dict[str, Any]:
    """Read the whole stream in one mode, counting only (as bench.cluster's read-back), with
    the CPU it cost; an incomplete read is a failure, as there."""
    label, reader = READERS[mode]
    pids = {**cluster.pids(), "client": os.getpid()}
    before = sample_cpu(pids)
    count = await reader(cluster, expected, CONSUME_TIMEOUT_S)
    after = sample_cpu(pids)
    if count < expected:
        raise AssertionError(f"{mode}: read {count} of {expected} messages")
    seconds = after.wall_s - before.wall_s
    return {
        "consumer": label,
        "messages": count,
        "seconds": round(seconds, 3),
        "msgs_per_s": round(count / seconds),
        "mb_per_s": round(count * VALUE_BYTES / seconds / 1e6, 2),
        "cpu": cpu_report(before, after),
    }


async def pipelined_scenario(settings: Settings) -> dict[str, Any]:
    async with fresh_cluster() as cluster:
        load = await pipelined_load(cluster, settings.ramp_s, settings.pipelined_s)
        info = await cluster.js.stream_info(STREAM)
        stored = int(info.state.messages)
        modes = {mode: await consume_case(cluster, mode, stored) for mode in READERS}
    fastest = max(modes, key=lambda mode: modes[mode]["msgs_per_s"])
    consume = {
        **modes["pull_fetch"],  # the headline stays the pull consumer the comparison asked for
        "stored": stored,
        "per_message_work": "none: counted only, as bench.cluster's read-back",
        "modes": modes,
        "fastest_mode": fastest,
        "fastest_msgs_per_s": modes[fastest]["msgs_per_s"],
    }
    return {"pipelined": load, "consume": consume}


@dataclass(slots=True)
class Steady:
    """A publish every 2 ms, each retried with its own msg id until acknowledged."""

    acked: list[int] = field(default_factory=list)
    ack_times: list[tuple[float, float]] = field(default_factory=list)  # (issued, acked)
    failed: int = 0
    retries: int = 0


async def steady_publisher(js: Any, load: Steady, stop: asyncio.Event) -> None:
    index = 0
    async with asyncio.TaskGroup() as tasks:
        while not stop.is_set():
            tasks.create_task(publish_until_acked(js, index, load))
            index += 1
            await asyncio.sleep(0.002)


async def publish_until_acked(js: Any, index: int, load: Steady) -> None:
    issued = time.monotonic()
    deadline = issued + 60
    while time.monotonic() < deadline:
        try:
            await js.publish(
                SUBJECT, value_of(index), timeout=1.0, headers={"Nats-Msg-Id": f"f{index}"}
            )
        except (nats.errors.Error, OSError):  # timeout, no responders, not leader: retry it
            load.retries += 1
            await asyncio.sleep(0.05)
            continue
        load.acked.append(index)
        load.ack_times.append((issued, time.monotonic()))
        return
    load.failed += 1


async def kill_leader_once(cluster: JetStreamCluster, load: Steady) -> dict[str, Any]:
    """SIGKILL the stream leader under load; time to the first ack of a publish issued after
    the kill; then restart it and wait until it is a current replica again, so each kill starts
    from a whole group (as bench.cluster waits for the restarted node to catch up)."""
    await asyncio.sleep(STEADY_BEFORE_KILL_S)
    before = await wait_group(cluster, lambda g: g.leader is not None, "the stream's leader")
    assert before.leader is not None
    server = cluster.by_name(before.leader)
    killed_at = time.monotonic()
    server.kill(signal.SIGKILL)

    async def resumed() -> bool:
        return any(issued > killed_at for issued, _ in load.ack_times)

    await poll_until(resumed, "an ack after the leader kill", READY_TIMEOUT_S)
    first = min(acked for issued, acked in load.ack_times if issued > killed_at)
    after = await wait_group(cluster, lambda g: g.leader is not None, "the new leader")
    restarted_at = time.monotonic()
    server.start()
    await wait_group(cluster, lambda g: g.all_current, f"{server.name} a current replica again")
    return {
        "killed": before.leader,
        "new_leader": after.leader,
        "resume_ms": round((first - killed_at) * 1000, 1),
        "restart_to_current_s": round(time.monotonic() - restarted_at, 2),
    }


async def failover_scenario(settings: Settings) -> dict[str, Any]:
    async with fresh_cluster() as cluster:
        load, stop = Steady(), asyncio.Event()
        kills = []
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(steady_publisher(cluster.js, load, stop))
            for _ in range(settings.failover_kills):
                kill = await kill_leader_once(cluster, load)
                kills.append(kill)
                progress(f"failover: killed {kill['killed']}, resumed in {kill['resume_ms']} ms")
            await asyncio.sleep(1.0)
            stop.set()
        values = await read_values(cluster, CONSUME_TIMEOUT_S)
    expected = {value_of(i) for i in load.acked}
    resumes = [k["resume_ms"] for k in kills]
    return {
        "failover": {
            "kills": kills,
            "resume_median_ms": statistics.median(resumes),
            "resume_max_ms": max(resumes),
            "acked": len(load.acked),
            "failed_publishes": load.failed,
            "retries": load.retries,
            "lost": len(expected - set(values)),
            "duplicated": sum(1 for v, n in values.items() if n > 1),
        }
    }


async def fsync_scenario(settings: Settings) -> dict[str, Any]:
    """Sequential and pipelined publishes against servers that fsync every message before
    they acknowledge it (`sync_interval: always`, nats-server 2.15 from PyPI: Debian's 2.9
    has no such setting), beside raftbroker's `fsync = true` in bench.cluster."""
    async with fresh_cluster(sync_always=True) as cluster:
        group = await wait_group(cluster, lambda g: g.leader is not None, "a stream leader")
        leader = cluster.by_name(str(group.leader))
        sequential = await sequential_through(cluster, leader, settings.sequential_s, 3_000_000)
        pipelined = await pipelined_load(cluster, settings.ramp_s, settings.pipelined_s)
    return {
        "fsync": {
            "server": nats_versions(sync_always=True)["nats-server"],
            "setting": "jetstream { sync_interval: always }",
            "sequential": {"client_on": "the stream leader's server", **sequential},
            "pipelined": pipelined,
        }
    }
