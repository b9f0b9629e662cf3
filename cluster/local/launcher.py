"""A local cluster: N node processes on distinct loopback addresses, started and stopped by PID.

Node i listens on 127.0.0.(i+2); every node uses the same port numbers on its own address, so a
chaos test can cut the links between two addresses. Each node has four: the native client
protocol, HTTP, Raft, and Kafka's protocol (`Ports`). The layout under the data directory:

    cluster.json          pids, addresses, ports: what `down` and `status` read
    node<i>.toml          each node's configuration (the same format a container uses)
    node<i>.log           each node's log
    node<i>/              each node's data (with node.lock, held by the running node)

Rules: a pid in cluster.json is a hint, never a licence to signal. The process that *is* node i
is the one holding node<i>/node.lock (the kernel says which: `layout.lock_holder`), or, in the
moment after its start before it takes the lock, the recorded pid while that process still has
the recorded start time and a command line naming node<i>.toml (`node_pid`). `down` signals
only such a process, through a pidfd opened before the identity is checked again, so a pid
reused in between is never hit; it reports which nodes it stopped and which were not running.
`start_missing` starts only the nodes no process is, and `wait_ready` fails at once, naming the
reason from its log, when a node it waits for is not running (one that died at start on a port
already in use, say).

A cluster secret is generated once and kept in the TOML files, so data survives down + up; the
nodes' Raft links are then authenticated and encrypted. `up(encrypted=False)` writes none: the
links run in clear, which a node allows on loopback only (the benchmark's like-for-like setting,
as NATS routes without TLS).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import secrets
import signal
import socket
import sys
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import NamedTuple

from cluster.broker import layout
from cluster.client import Admin, Client, ClientError

STATE_FILE = "cluster.json"
PORT_RANGE = (12_000, 32_000)  # below Linux's ephemeral ports (32768 and up)
STOP_POLL_S = 0.05
# The log line of a node that could not run (cli/runtime.py logs it at CRITICAL).
_CRITICAL = re.compile(r" CRITICAL [\w.]+: (?P<message>.*)$")


@dataclass(frozen=True, slots=True)
class NodeProcess:
    node_id: int
    host: str
    client_port: int
    raft_port: int
    http_port: int
    pid: int
    # When the process started (/proc/<pid>/stat, clock ticks since boot): with its command
    # line, what tells it from another process given the same pid later. 0: not recorded.
    start_ticks: int = 0
    kafka_port: int = 0  # 0: none (a cluster.json written before the Kafka listener)

    @property
    def client_address(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def kafka_address(self) -> str:
        return f"{self.host}:{self.kafka_port}"


class NodeExitedError(RuntimeError):
    """A node the caller waits for is not running (it died at start, or was stopped)."""


@dataclass(frozen=True, slots=True)
class LocalCluster:
    data_dir: Path
    nodes: tuple[NodeProcess, ...]

    @property
    def bootstrap(self) -> list[str]:
        return [n.client_address for n in self.nodes]

    @property
    def kafka_bootstrap(self) -> list[str]:
        """Kafka clients' `bootstrap.servers`: every node's Kafka listener."""
        return [n.kafka_address for n in self.nodes if n.kafka_port]

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

    def current(self) -> LocalCluster:
        """This cluster as its `cluster.json` records it now: a node restarted since this
        value was taken has another pid there (as given, if the file is gone)."""
        return LocalCluster.load(self.data_dir) or self


def host_of(index: int) -> str:
    return f"127.0.0.{index + 2}"


def node_dir(data_dir: Path, node_id: int) -> Path:
    return data_dir / f"node{node_id}"


def config_path(data_dir: Path, node_id: int) -> Path:
    return data_dir / f"node{node_id}.toml"


def log_path(data_dir: Path, node_id: int) -> Path:
    return data_dir / f"node{node_id}.log"


def port_free(host: str, port: int) -> bool:
    """Whether a node could listen on `host:port`. With SO_REUSEADDR, as a node's listeners
    bind: connections of an earlier listener still in TIME_WAIT do not make a port taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


class Ports(NamedTuple):
    """A node's ports (every node of a local cluster has the same, each on its own address)."""

    client: int  # the native protocol
    http: int
    raft: int
    kafka: int  # Kafka's protocol


# The ports of a local cluster started by `raftbroker cluster up`, when free, on each node's own
# loopback address: Kafka's own 9092 for the Kafka listener (Kafka clients and kcat reach
# `127.0.0.2:9092` as they would a Kafka broker), the native protocol on 9192, so that the
# examples can say these addresses and work as written.
CONVENTIONAL_PORTS = Ports(9192, 8092, 19092, 9092)


def ports_free(count: int, ports: tuple[int, ...]) -> bool:
    """Whether `ports` are free on the addresses of all `count` nodes."""
    return all(port_free(host_of(i), port) for i in range(count) for port in ports)


def choose_ports(count: int, seed: int) -> Ports:
    """Ports free on every node's address."""
    span = PORT_RANGE[1] - PORT_RANGE[0] - 10
    for attempt in range(50):
        base = PORT_RANGE[0] + (seed * 7_919 + attempt * 2_099) % span
        ports = Ports(base, base + 1, base + 10, base + 2)
        if ports_free(count, ports):
            return ports
    raise RuntimeError("no free ports found on the loopback addresses")


def write_configs(
    data_dir: Path,
    count: int,
    ports: Ports,
    secret: str | None,
    extra_toml: str = "",
) -> list[Path]:
    client_port, http_port, raft_port, kafka_port = ports
    peers = "".join(
        f'\n[[peers]]\nnode_id = {i + 1}\nhost = "{host_of(i)}"\n'
        f"client_port = {client_port}\nraft_port = {raft_port}\nkafka_port = {kafka_port}\n"
        for i in range(count)
    )
    secret_toml = "" if secret is None else f'cluster_secret = "{secret}"\n'
    paths = []
    for i in range(count):
        text = (
            f'node_id = {i + 1}\nhost = "{host_of(i)}"\nclient_port = {client_port}\n'
            f"raft_port = {raft_port}\nhttp_port = {http_port}\nkafka_port = {kafka_port}\n"
            f'data_dir = "{node_dir(data_dir, i + 1)}"\n{secret_toml}'
            f"{extra_toml}{peers}"
        )
        path = config_path(data_dir, i + 1)
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
    preferred_ports: Ports | None = None,
) -> LocalCluster:
    """Start `count` nodes (reusing the data, ports and secret of an earlier cluster in
    data_dir); on `preferred_ports` when they are free, else on free ones; without
    `encrypted`, with no secret: Raft links in clear, on loopback."""
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    previous = LocalCluster.load(data_dir)
    if previous is not None and previous.nodes:
        ports = _recorded_ports(previous.nodes[0], count)
    elif preferred_ports is not None and ports_free(count, preferred_ports):
        ports = preferred_ports
    else:
        ports = choose_ports(count, os.getpid())
    secret = (existing_secret(data_dir) or new_secret()) if encrypted else None
    write_configs(data_dir, count, ports, secret, extra_toml)
    nodes: list[NodeProcess] = []
    for i in range(count):
        recorded = NodeProcess(
            i + 1, host_of(i), ports.client, ports.raft, ports.http, 0, kafka_port=ports.kafka
        )
        nodes.append(_spawn(data_dir, recorded))
        LocalCluster(data_dir, tuple(nodes)).save()  # recorded at once: `down` finds them all
    return LocalCluster(data_dir, tuple(nodes))


def _recorded_ports(first: NodeProcess, count: int) -> Ports:
    """An earlier cluster's ports; one recorded before the Kafka listener gets a Kafka port
    now (Kafka's own when free)."""
    kafka = first.kafka_port
    if not kafka:
        taken = {first.client_port, first.http_port, first.raft_port}
        candidates = [CONVENTIONAL_PORTS.kafka, *choose_ports(count, os.getpid())]
        kafka = next(p for p in candidates if p not in taken and ports_free(count, (p,)))
    return Ports(first.client_port, first.http_port, first.raft_port, kafka)


def _spawn(data_dir: Path, node: NodeProcess) -> NodeProcess:
    """Start `node` from its configuration file; its record with the new pid and start time."""
    pid = start_node(config_path(data_dir, node.node_id), log_path(data_dir, node.node_id))
    return replace(node, pid=pid, start_ticks=process_start_ticks(pid) or 0)


def restart_node(cluster: LocalCluster, node_id: int) -> LocalCluster:
    """Start one node again (after it was killed) with its existing configuration."""
    old = next(n for n in cluster.nodes if n.node_id == node_id)
    assert not alive(old.pid), f"node {node_id} (pid {old.pid}) is still running"
    return _with_node(cluster, _spawn(cluster.data_dir, old))


def _with_node(cluster: LocalCluster, node: NodeProcess) -> LocalCluster:
    nodes = tuple(node if n.node_id == node.node_id else n for n in cluster.nodes)
    updated = LocalCluster(cluster.data_dir, nodes)
    updated.save()
    return updated


def start_missing(cluster: LocalCluster) -> tuple[LocalCluster, tuple[int, ...]]:
    """Start every node of `cluster` that no process is (`node_pid`), from its existing
    configuration; the cluster as recorded now, and the ids of the nodes started."""
    started = []
    for node in cluster.nodes:
        if node_pid(cluster, node) is None:
            cluster = _with_node(cluster, _spawn(cluster.data_dir, node))
            started.append(node.node_id)
    return cluster, tuple(started)


# -- which process is a node ------------------------------------------------------------------


def node_pid(cluster: LocalCluster, node: NodeProcess) -> int | None:
    """The pid of the process that is `node` now, or None when none is.

    The holder of its data directory's lock, which the node takes first thing; before that (a
    node just started) the recorded pid, if that process still has the recorded start time and
    runs `node --config` with this node's configuration file. Anything else, whatever pid
    cluster.json says, is not the node.
    """
    holder = layout.lock_holder(node_dir(cluster.data_dir, node.node_id))
    if holder is not None:
        return holder
    if node.start_ticks and _is_recorded_process(cluster, node):
        return node.pid
    return None


def _is_recorded_process(cluster: LocalCluster, node: NodeProcess) -> bool:
    if process_start_ticks(node.pid) != node.start_ticks:
        return False  # gone, a zombie, or another process under a reused pid
    argv = _cmdline(node.pid)
    config = str(config_path(cluster.data_dir, node.node_id))
    return "node" in argv and any(
        flag == "--config" and value == config for flag, value in itertools.pairwise(argv)
    )


def process_start_ticks(pid: int) -> int | None:
    """When a live process started (clock ticks since boot); None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # the command name may hold spaces and brackets
    if fields[0] == "Z":
        return None
    return int(fields[19])  # field 22 of proc(5); fields[0] is field 3


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [os.fsdecode(arg) for arg in raw.split(b"\0") if arg]


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


@dataclass(frozen=True, slots=True)
class StopReport:
    """What `down` did, by node id."""

    stopped: tuple[int, ...]  # was running, is stopped
    not_running: tuple[int, ...]  # no process was that node
    killed: tuple[int, ...]  # of `stopped`: SIGKILLed, SIGTERM was not enough in time
    # (node id, pid): cluster.json named a live process that is not the node; left alone.
    strangers: tuple[tuple[int, int], ...]


def down(
    cluster: LocalCluster, timeout_s: float = 10.0, *, only: Collection[int] | None = None
) -> StopReport:
    """SIGTERM every node (or those of `only`, by id) that is running (`node_pid`), then
    SIGKILL whatever of them is left after `timeout_s`. No other process is ever signalled."""
    by_id = {n.node_id: n for n in cluster.nodes}
    running: dict[int, int] = {}
    not_running, strangers = [], []
    for node in cluster.nodes:
        if only is not None and node.node_id not in only:
            continue
        pid = node_pid(cluster, node)
        if pid is not None and signal_node(cluster, node, pid, signal.SIGTERM):
            running[node.node_id] = pid
        else:
            not_running.append(node.node_id)
        if pid != node.pid and process_start_ticks(node.pid) is not None:
            strangers.append((node.node_id, node.pid))

    def left() -> list[int]:
        return [i for i, pid in running.items() if _still_node(cluster, by_id[i], pid)]

    _wait_until_none(left, timeout_s)
    killed = [i for i in left() if signal_node(cluster, by_id[i], running[i], signal.SIGKILL)]
    if _wait_until_none(left, timeout_s):
        raise TimeoutError(f"nodes {left()} still running {timeout_s} s after SIGKILL")
    return StopReport(tuple(running), tuple(not_running), tuple(killed), tuple(strangers))


def _still_node(cluster: LocalCluster, node: NodeProcess, pid: int) -> bool:
    # `alive` first: it reaps a child of ours that has exited, which then is no node.
    return alive(pid) and node_pid(cluster, node) == pid


def _wait_until_none(left: Callable[[], list[int]], timeout_s: float) -> list[int]:
    """Poll `left()` until it is empty or `timeout_s` passed; what it last returned."""
    deadline = time.monotonic() + timeout_s
    while (remaining := left()) and time.monotonic() < deadline:
        time.sleep(STOP_POLL_S)
    return remaining


def signal_node(cluster: LocalCluster, node: NodeProcess, pid: int, sig: int) -> bool:
    """Send `sig` to `pid` only if it is `node` (`node_pid`); whether it was sent.

    The pidfd is opened before the identity is checked: from then on it names that very
    process, so a pid freed and reused between the check and the signal is never hit.
    """
    return _signal_if(pid, sig, lambda: node_pid(cluster, node) == pid)


def _signal_if(pid: int, sig: int, is_it: Callable[[], bool]) -> bool:
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        if not is_it():
            return False
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        return False  # it ended after the pidfd was opened
    finally:
        os.close(pidfd)
    return True


async def wait_ready(cluster: LocalCluster, timeout_s: float = 60.0) -> None:
    """Until every node answers, knows a metadata leader, and every broker is registered.

    NodeExitedError as soon as a node is not running (as cluster.json records the cluster
    now): waiting on would only end in the timeout. Its message names the node and the reason
    its log gives (a port already in use, say)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    client = Client(cluster.bootstrap, request_timeout_s=2.0)
    try:
        while not await _all_ready(client, cluster):
            _raise_if_exited(cluster.current())
            if loop.time() > deadline:
                raise TimeoutError(f"cluster in {cluster.data_dir} not ready in {timeout_s:.0f} s")
            await asyncio.sleep(0.1)
    finally:
        await client.close()


def _raise_if_exited(cluster: LocalCluster) -> None:
    for node in cluster.nodes:
        # Its process is gone (reaped here if it is a child of ours). Identity (`node_pid`) is
        # what decides whom `down` may signal; a node that just started may not hold its lock
        # yet, and waiting on a live process costs at most the timeout.
        if not alive(node.pid):
            reason = exit_reason(log_path(cluster.data_dir, node.node_id))
            raise NodeExitedError(f"node {node.node_id} is not running: {reason}")


def exit_reason(log: Path) -> str:
    """Why a node stopped, as its log says: its last CRITICAL line, else its last line."""
    with contextlib.suppress(OSError):
        lines = log.read_text(errors="replace").splitlines()[-50:]
        for line in reversed(lines):
            found = _CRITICAL.search(line)
            if found is not None:
                return found["message"]
        if lines:
            return f"its log ends with: {lines[-1]}"
    return f"no log at {log}"


async def _all_ready(client: Client, cluster: LocalCluster) -> bool:
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
