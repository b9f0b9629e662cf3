"""Raft's steady-state shortcuts (cluster/raft.py) and the stock paths they leave the rest to.

A leader sends a new entry alone (`_send_new_entry`) only while every follower holds everything
before it, and a follower takes an append directly (`_extends_log`) only when it goes right after
its last entry. A follower that was away breaks both: the leader must fall back to pysyncobj's
walk while it is gone and to bring it back, the follower to the stock handler for entries it
lacks. Three real replicas on one loop, on loopback; every one must end with every command, in
order.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cluster import local_cluster
from cluster.config import Timing
from cluster.mesh import MeshSettings
from cluster.raft import GroupSpec, RaftDriver, RaftGroup
from tests.cluster.raft_harness import HashChain
from tests.cluster.test_raft_entries import until

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
BURST = 40


class Replica:
    def __init__(self, index: int, addresses: list[str], directory: Path) -> None:
        self.address = addresses[index]
        self.peers = tuple(a for a in addresses if a != self.address)
        self.directory = directory
        self.machine = HashChain()
        self.driver: RaftDriver | None = None
        self.group: RaftGroup | None = None

    async def start(self) -> None:
        settings = MeshSettings(
            self.address,
            frozenset(self.peers),
            secret=None,
            frame_bytes_max=1 << 20,
            queue_bytes_max=8 << 20,
            timeout_s=2.5,
            retry_s=0.1,
            ping_s=0.1,
        )
        self.machine = HashChain()  # a restart rebuilds it from the journal
        self.driver = RaftDriver(Timing(), settings, compaction_entries=1_000_000)
        self.driver.start()
        spec = GroupSpec("catch-up", self.address, self.peers, self.directory, "catch-up")
        self.group = await self.driver.add_group(spec, self.machine, max_pending=100)

    def stop(self) -> None:
        assert self.driver is not None
        self.driver.stop()
        self.driver = self.group = None


async def propose_burst(leader: RaftGroup, first: int) -> None:
    for i in range(first, first + BURST):  # one at a time: the steady state's shortcuts
        await leader.propose(i.to_bytes(4, "big"), timeout_s=10)


@pytest.mark.asyncio
async def test_a_follower_away_and_back_gets_every_entry_through_the_stock_paths(
    tmp_path: Path,
) -> None:
    port = local_cluster.choose_ports(len(HOSTS), os.getpid())[2]
    addresses = [f"{host}:{port}" for host in HOSTS]
    replicas = [Replica(i, addresses, tmp_path / f"r{i}") for i in range(len(HOSTS))]
    try:
        for replica in replicas:
            await replica.start()
        await until(lambda: any(r.group and r.group.serving for r in replicas), "a leader")
        leader = next(r for r in replicas if r.group and r.group.serving)
        away = next(r for r in replicas if r is not leader)
        assert leader.group is not None

        assert leader.driver is not None
        mesh = leader.driver.mesh

        await propose_burst(leader.group, 0)  # all followers hold everything: the shortcuts
        away.stop()
        await propose_burst(leader.group, BURST)  # one follower gone: the stock walk
        await away.start()
        await until(lambda: mesh.is_open(away.address), "the follower's link back")
        # Connected but behind: no shortcut to it; the walk brings it back and its stock
        # handler takes in what it lacks, while new entries keep coming.
        await propose_burst(leader.group, 2 * BURST)
        await until(lambda: away.machine.count == 3 * BURST, "the follower caught up")
        await propose_burst(leader.group, 3 * BURST)  # all hold everything again: shortcuts

        total = 4 * BURST
        await until(
            lambda: all(r.machine.count == total for r in replicas), "every replica applying all"
        )
        expected = HashChain()
        for i in range(total):
            expected.apply(i.to_bytes(4, "big"))
        assert [r.machine.digest for r in replicas] == [expected.digest] * len(replicas)
    finally:
        for replica in replicas:
            if replica.driver is not None:
                replica.stop()
