"""The peer side of the comparison: a 3-node NATS JetStream cluster, the same workload.

Role: what `bench.cluster` measures for raftbroker, measured for NATS JetStream (Raft per
stream, de-duplication by `Nats-Msg-Id`), the closest runnable peer, through its Python client
`nats-py`, as a Python user would drive it. Run it as `python -m bench.jetstream [--quick]
[--out FILE] [--scenarios a,b]`; one JSON object on stdout (progress on stderr); exit 1 if a
scenario failed (a slow result is a result).

Method: three `nats-server` processes (Debian's package) on 127.0.0.2-4, one per address, each
with JetStream, file storage under a temporary directory, and routes to the other two; a fresh
cluster per scenario, stopped by PID in a `finally` (also on SIGTERM). Stream `BENCH`
(subjects `bench.>`), 3 replicas, file storage, a 2-minute duplicate window. Every publish
carries a unique `Nats-Msg-Id` and waits for its PubAck (a quorum stored it; NATS 2.9 does not
fsync before acknowledging: its `sync_interval` is 2 minutes). Values as raftbroker's: 100
bytes, a 12-digit index then random letters. CPU per server and of this client process, as in
`bench.cluster`.

Scenarios:
- sequential: each publish awaited before the next, for a few seconds: rate, latency.
- pipelined: `publish_async` (nats-py's own pipelining path) with up to 16,000 publishes
  pending, a deep window (nats-py's default of 4,000 gave 28k msgs/s against 33k in a trial),
  every PubAck awaited, for 10 s after a ramp: acknowledged msgs/s, MB/s, CPU.
- consume: the stream filled by the pipelined load, read from the start by one pull consumer
  (ephemeral, AckNone: like a Kafka consumer, no ack per message) in batches of 1,000.
- failover: a publish every 2 ms, each retried with the same `Nats-Msg-Id` until acknowledged;
  SIGKILL of the stream leader (from `stream_info`), restart, 3 times; kill -> first ack of a
  publish issued after the kill; then the stream read back: acknowledged values missing, and
  values present twice.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import nats
from nats.js import api as js_api

from bench import apply as apply_bench
from bench.cluster import (
    cpu_report,
    latency_summary_ms,
    load_average,
    poll_until,
    run_loop,
    sample_cpu,
    value_of,
)
from cluster import local_cluster

NODES = 3
STREAM = "BENCH"
SUBJECT = "bench.v"
DUPLICATE_WINDOW_S = 120.0
ASYNC_WINDOW = 16_000  # publishes pending; 4,000 (nats-py's default) gave 28k/s against 33k here
FETCH_BATCH = 1_000
REQUEST_TIMEOUT_S = 5.0


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

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                ["nats-server", "-c", str(self.config)],
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
    name: str, host: str, ports: tuple[int, int], store: Path, hosts: list[str]
) -> str:
    client_port, cluster_port = ports
    routes = ", ".join(f"nats-route://{h}:{cluster_port}" for h in hosts if h != host)
    return (
        f"server_name: {name}\nlisten: {host}:{client_port}\n"
        f'jetstream {{ store_dir: "{store}", max_memory_store: 268435456, '
        f"max_file_store: 8589934592 }}\n"
        f"cluster {{ name: rbbench, listen: {host}:{cluster_port}, routes: [{routes}] }}\n"
    )


@contextlib.asynccontextmanager
async def fresh_cluster() -> AsyncIterator[JetStreamCluster]:
    """Three nats-servers with JetStream, the stream created; stopped by PID and removed after."""
    root = Path(tempfile.mkdtemp(prefix="raftbroker-bench-nats-"))
    client_port, _, cluster_port = local_cluster.choose_ports(NODES, int(time.time()))
    hosts = [local_cluster.host_of(i) for i in range(NODES)]
    servers = []
    for i, host in enumerate(hosts):
        config = root / f"n{i + 1}.conf"
        config.write_text(
            server_config(f"n{i + 1}", host, (client_port, cluster_port), root / f"n{i + 1}", hosts)
        )
        servers.append(Server(f"n{i + 1}", host, config, root / f"n{i + 1}.log"))
    cluster = JetStreamCluster(servers, client_port)
    try:
        for server in servers:
            server.start()
        await connect(cluster)
        await create_stream(cluster)
        yield cluster
    finally:
        if cluster.nc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(cluster.nc.close(), 5)
        for server in servers:
            server.kill(signal.SIGTERM)
        shutil.rmtree(root, ignore_errors=True)


async def connect(cluster: JetStreamCluster) -> None:
    cluster.nc = await nats.connect(
        servers=cluster.urls,
        connect_timeout=2,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.1,
        allow_reconnect=True,
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
        except Exception:  # no meta leader yet, or the stream's group not elected yet
            return False
        return True

    await poll_until(created, "a JetStream stream with a leader", 60.0)


async def publish_acked(js: Any, index: int) -> Any:
    return await js.publish(
        SUBJECT, value_of(index), timeout=REQUEST_TIMEOUT_S, headers={"Nats-Msg-Id": str(index)}
    )


# -- scenarios ------------------------------------------------------------------------------------


async def sequential_scenario(settings: Settings) -> dict[str, Any]:
    async with fresh_cluster() as cluster:
        latencies: list[float] = []
        end = time.monotonic() + settings.sequential_s
        index = 1_000_000
        while time.monotonic() < end:
            start = time.perf_counter()
            await publish_acked(cluster.js, index)
            latencies.append(time.perf_counter() - start)
            index += 1
    return {
        "sequential": {
            "mode": "each publish awaited before the next",
            "seconds": settings.sequential_s,
            "messages": len(latencies),
            "rate_per_s": round(len(latencies) / settings.sequential_s),
            **latency_summary_ms(latencies),
        }
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
        "mb_per_s": round(rate * 100 / 1e6, 2),
        "sent_in_total": index,
        "acked_in_total": acked,
        "cpu": cpu_report(before, after),
    }


async def read_all(
    cluster: JetStreamCluster, expected: int, timeout_s: float
) -> tuple[Counter[bytes], float]:
    """Every message of the stream through one pull consumer; (values, seconds taken)."""
    config = js_api.ConsumerConfig(
        ack_policy=js_api.AckPolicy.NONE, deliver_policy=js_api.DeliverPolicy.ALL
    )
    sub = await cluster.js.pull_subscribe("bench.>", config=config)
    values: Counter[bytes] = Counter()
    start = time.monotonic()
    count = 0
    while count < expected and time.monotonic() - start < timeout_s:
        try:
            msgs = await sub.fetch(FETCH_BATCH, timeout=1.0)
        except nats.errors.TimeoutError:
            continue
        for msg in msgs:
            values[msg.data] += 1
        count += len(msgs)
    elapsed = time.monotonic() - start
    with contextlib.suppress(Exception):
        await asyncio.wait_for(sub.unsubscribe(), 5)
    return values, elapsed


async def pipelined_scenario(settings: Settings) -> dict[str, Any]:
    async with fresh_cluster() as cluster:
        load = await pipelined_load(cluster, settings.ramp_s, settings.pipelined_s)
        info = await cluster.js.stream_info(STREAM)
        stored = int(info.state.messages)
        pids = {**cluster.pids(), "client": os.getpid()}
        before = sample_cpu(pids)
        values, elapsed = await read_all(cluster, stored, 120.0)
        after = sample_cpu(pids)
        read = sum(values.values())
    consume = {
        "consumer": f"one pull consumer, AckNone, fetch batches of {FETCH_BATCH}",
        "messages": read,
        "stored": stored,
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(read / elapsed) if elapsed > 0 else None,
        "cpu": cpu_report(before, after),
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
        except Exception:  # timeout, no responders, not leader: retry the same message
            load.retries += 1
            await asyncio.sleep(0.05)
            continue
        load.acked.append(index)
        load.ack_times.append((issued, time.monotonic()))
        return
    load.failed += 1


async def stream_leader(cluster: JetStreamCluster) -> str | None:
    try:
        info = await cluster.js.stream_info(STREAM)
    except Exception:
        return None
    leader: str | None = getattr(getattr(info, "cluster", None), "leader", None)
    return leader


async def kill_leader_once(cluster: JetStreamCluster, load: Steady) -> dict[str, Any]:
    await asyncio.sleep(1.0)  # steady load before the kill
    leader = None
    while leader is None:
        leader = await stream_leader(cluster)
    server = cluster.by_name(leader)
    killed_at = time.monotonic()
    server.kill(signal.SIGKILL)

    async def resumed() -> bool:
        return any(issued > killed_at for issued, _ in load.ack_times)

    await poll_until(resumed, "an ack after the leader kill", 60.0)
    first = min(acked for issued, acked in load.ack_times if issued > killed_at)
    server.start()

    async def back() -> bool:
        return await stream_leader(cluster) is not None

    await poll_until(back, "the stream to have a leader again", 60.0)
    return {"killed": leader, "resume_ms": round((first - killed_at) * 1000, 1)}


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
        info = await cluster.js.stream_info(STREAM)
        values, _ = await read_all(cluster, int(info.state.messages), 60.0)
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


SCENARIOS = {
    "sequential": sequential_scenario,
    "pipelined": pipelined_scenario,
    "failover": failover_scenario,
}


def nats_versions() -> dict[str, str]:
    server = subprocess.run(
        ["nats-server", "--version"], capture_output=True, text=True, check=False
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
        except Exception as exc:  # reported; the other scenarios still run
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
            "hosts": [local_cluster.host_of(i) for i in range(NODES)],
        },
        **sections,
        "errors": errors,
    }


async def main_async(settings: Settings, names: Sequence[str]) -> dict[str, Any]:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await run(settings, names)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.jetstream",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="a few seconds per scenario")
    parser.add_argument("--out", type=Path, help="also write the JSON to this file")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = parser.parse_args(argv)
    names = [n for n in args.scenarios.split(",") if n]
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {sorted(unknown)}")
    report = run_loop(main_async(Settings.of(args.quick), names))
    text = json.dumps(report, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    sys.stdout.write(text + "\n")
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
