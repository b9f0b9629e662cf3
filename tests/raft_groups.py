"""Real Raft groups in the test's own process: one replica on this loop, over a loopback mesh.

Shared by the component tests of a group's entries (tests/component/test_raft_entries.py), the
Raft tests of tests/cluster/ and the peer-entry attacks of tests/adversarial/.
"""

from __future__ import annotations

import socket
from pathlib import Path

from cluster.config import Timing
from cluster.raft import GroupSpec, MeshSettings, RaftDriver, RaftGroup
from tests.cluster.raft_harness import HashChain

HOST = "127.0.0.2"


def loopback_mesh(address: str, peers: tuple[str, ...] | frozenset[str]) -> MeshSettings:
    """Mesh settings for a test replica at `address`: links in clear, short timeouts."""
    return MeshSettings(
        address,
        frozenset(peers),
        secret=None,
        frame_bytes_max=1 << 20,
        queue_bytes_max=8 << 20,
        timeout_s=2.5,
        retry_s=0.1,
        ping_s=0.1,
    )


async def started_group(
    directory: Path,
    machine: HashChain,
    port: int,
    *,
    host: str = HOST,
    peers: tuple[str, ...] = (),
    name: str = "entries",
    compaction_entries: int = 1_000_000,
    compaction_bytes: int = 1 << 30,
    durable: bool = False,
) -> tuple[RaftDriver, RaftGroup]:
    """A replica of group `name` at `host:port` (peers: their addresses), on this loop."""
    address = f"{host}:{port}"
    settings = loopback_mesh(address, peers)
    driver = RaftDriver(
        Timing(),
        settings,
        compaction_entries=compaction_entries,
        compaction_bytes=compaction_bytes,
        durable=durable,
    )
    driver.start()
    spec = GroupSpec(name, address, peers, directory, name)
    group = await driver.add_group(spec, machine, max_pending=100)
    return driver, group


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port
