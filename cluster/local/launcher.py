"""A local cluster: N node processes on distinct loopback addresses, started and stopped by PID.

Node i listens on 127.0.0.(i+2); every node uses the same port numbers on its own address, so a
chaos test can cut the links between two addresses. The layout under the data directory:

    cluster.json          pids, addresses, ports: what `down` and `status` read
    node<i>.toml          each node's configuration (the same format a container uses)
    node<i>.log           each node's log
    node<i>/              each node's data

A cluster secret is generated once and kept in the TOML files, so data survives down + up; the
nodes' Raft links are then authenticated and encrypted. `up(encrypted=False)` writes none: the
links run in clear, which a node allows on loopback only (the benchmark's like-for-like setting,
as NATS routes without TLS).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from cluster.client import Admin, ClientError, Cluster

STATE_FILE = "cluster.json"
PORT_RANGE = (12_000, 32_000)  # below Linux's ephemeral ports (32768 and up)


@dataclass(frozen=True, slots=True)
class NodeProcess:
    node_id: int
    host: str
    client_port: int
    raft_port: int
    http_port: int
    pid: int

    @property
    def client_address(self) -> str:
        return f"{self.host}:{self.client_port}"


@dataclass(frozen=True, slots=True)
class LocalCluster:
    data_dir: Path
    nodes: tuple[NodeProcess, ...]

    @property
    def bootstrap(self) -> list[str]:
        return [n.client_address for n in self.nodes]

    def save(self) -> None:
        state = {"data_dir": str(self.data_dir), "nodes": [asdict(n) for n in self.nodes]}
        (self.data_dir / STATE_FILE).write_text(json.dumps(state, indent=2))

    @classmethod
    def load(cls, data_dir: Path) -> LocalCluster | None:
        path = data_dir / STATE_FILE
        if not path.exists():
            return None
        state = json.loads(path.read_text())
        return cls(data_dir, tuple(NodeProcess(**n) for n in state["nodes"]))


def host_of(index: int) -> str:
    return f"127.0.0.{index + 2}"


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


# Client, HTTP and Raft ports of a local cluster started by `raftbroker cluster up`, when free:
# Kafka's client port, on each node's own loopback address, so that examples can say
# `127.0.0.2:9092` and work as written.
CONVENTIONAL_PORTS = (9092, 8092, 19092)


def ports_free(count: int, ports: tuple[int, int, int]) -> bool:
    """Whether `ports` are free on the addresses of all `count` nodes."""
    return all(_port_free(host_of(i), port) for i in range(count) for port in ports)


def choose_ports(count: int, seed: int) -> tuple[int, int, int]:
    """(client, http, raft) ports free on every node's address."""
    span = PORT_RANGE[1] - PORT_RANGE[0] - 10
    for attempt in range(50):
        base = PORT_RANGE[0] + (seed * 7_919 + attempt * 2_099) % span
        ports = (base, base + 1, base + 10)
        if ports_free(count, ports):
            return ports
    raise RuntimeError("no free ports found on the loopback addresses")


def write_configs(
    data_dir: Path,
    count: int,
    ports: tuple[int, int, int],
    secret: str | None,
    extra_toml: str = "",
) -> list[Path]:
    client_port, http_port, raft_port = ports
    peers = "".join(
        f'\n[[peers]]\nnode_id = {i + 1}\nhost = "{host_of(i)}"\n'
        f"client_port = {client_port}\nraft_port = {raft_port}\n"
        for i in range(count)
    )
    secret_toml = "" if secret is None else f'cluster_secret = "{secret}"\n'
    paths = []
    for i in range(count):
        text = (
            f'node_id = {i + 1}\nhost = "{host_of(i)}"\nclient_port = {client_port}\n'
            f"raft_port = {raft_port}\nhttp_port = {http_port}\n"
            f'data_dir = "{data_dir / f"node{i + 1}"}"\n{secret_toml}'
            f"{extra_toml}{peers}"
        )
        path = data_dir / f"node{i + 1}.toml"
        path.write_text(text)
        paths.append(path)
    return paths


def new_secret() -> str:
    """A fresh cluster secret: 32 random bytes, which `check_cluster_secret` accepts."""
    return secrets.token_urlsafe(32)


def existing_secret(data_dir: Path) -> str | None:
    path = data_dir / "node1.toml"
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        if line.startswith("cluster_secret"):
            return line.split("=", 1)[1].strip().strip('"')
    return None


def start_node(config_path: Path, log_path: Path) -> int:
    """Start a node in a session of its own, its output appended to `log_path`; its pid.

    Spawned without a `Popen`: a node outlives the call (and often the launching process), is
    tracked by pid in cluster.json and reaped by `alive`, so there is no handle to keep.
    """
    return os.posix_spawn(
        sys.executable,
        [sys.executable, "-m", "cli", "node", "--config", str(config_path)],
        {**os.environ, "PYTHONUNBUFFERED": "1"},
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 1, str(log_path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ],
        setsid=True,
    )


def up(
    data_dir: Path,
    count: int = 3,
    extra_toml: str = "",
    *,
    encrypted: bool = True,
    preferred_ports: tuple[int, int, int] | None = None,
) -> LocalCluster:
    """Start `count` nodes (reusing the data, ports and secret of an earlier cluster in
    data_dir); on `preferred_ports` (client, HTTP, Raft) when they are free, else on free ones;
    without `encrypted`, with no secret: Raft links in clear, on loopback."""
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    previous = LocalCluster.load(data_dir)
    if previous is not None and previous.nodes:
        first = previous.nodes[0]
        ports = (first.client_port, first.http_port, first.raft_port)
    elif preferred_ports is not None and ports_free(count, preferred_ports):
        ports = preferred_ports
    else:
        ports = choose_ports(count, os.getpid())
    secret = (existing_secret(data_dir) or new_secret()) if encrypted else None
    configs = write_configs(data_dir, count, ports, secret, extra_toml)
    nodes: list[NodeProcess] = []
    for i, config in enumerate(configs):
        pid = start_node(config, data_dir / f"node{i + 1}.log")
        nodes.append(NodeProcess(i + 1, host_of(i), ports[0], ports[2], ports[1], pid))
        LocalCluster(data_dir, tuple(nodes)).save()  # recorded at once: `down` finds them all
    return LocalCluster(data_dir, tuple(nodes))


def restart_node(cluster: LocalCluster, node_id: int) -> LocalCluster:
    """Start one node again (after it was killed) with its existing configuration."""
    old = next(n for n in cluster.nodes if n.node_id == node_id)
    assert not alive(old.pid), f"node {node_id} (pid {old.pid}) is still running"
    config = cluster.data_dir / f"node{node_id}.toml"
    pid = start_node(config, cluster.data_dir / f"node{node_id}.log")
    nodes = tuple(
        NodeProcess(n.node_id, n.host, n.client_port, n.raft_port, n.http_port, pid)
        if n.node_id == node_id
        else n
        for n in cluster.nodes
    )
    updated = LocalCluster(cluster.data_dir, nodes)
    updated.save()
    return updated


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return not _zombie(pid)  # not our child: it exists, unless only its exit status is left
    return waited == 0


def _zombie(pid: int) -> bool:
    """A dead process its parent has not reaped (in a container, PID 1 may never reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] == "Z"


def kill(pid: int, sig: int = signal.SIGKILL, wait_s: float = 0.0) -> None:
    """Send `sig`; with `wait_s`, poll until the process is gone (its ports free again)."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + wait_s
    while wait_s and alive(pid):
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {pid} still alive {wait_s} s after signal {sig}")
        time.sleep(0.01)


def down(cluster: LocalCluster, timeout_s: float = 10.0) -> None:
    """SIGTERM every node, then SIGKILL whatever is left after `timeout_s`."""
    for n in cluster.nodes:
        kill(n.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while any(alive(n.pid) for n in cluster.nodes) and time.monotonic() < deadline:
        time.sleep(0.05)
    for n in cluster.nodes:
        if alive(n.pid):
            kill(n.pid)


async def wait_ready(cluster: LocalCluster, timeout_s: float = 60.0) -> None:
    """Until every node answers, knows a metadata leader, and every broker is registered."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    client = Cluster(cluster.bootstrap, request_timeout_s=2.0)
    try:
        while not await _all_ready(client, cluster):
            if loop.time() > deadline:
                raise TimeoutError(f"cluster in {cluster.data_dir} not ready in {timeout_s:.0f} s")
            await asyncio.sleep(0.1)
    finally:
        await client.close()


async def _all_ready(client: Cluster, cluster: LocalCluster) -> bool:
    try:
        for node in cluster.nodes:
            status = await Admin(client).cluster_status(node.client_address)
            metadata = [g for g in status.groups if g.group == "__metadata"]
            if not metadata or metadata[0].leader_id < 0:
                return False
        meta = await client.refresh()
    except ClientError:
        return False
    return len(meta.brokers) == len(cluster.nodes)
