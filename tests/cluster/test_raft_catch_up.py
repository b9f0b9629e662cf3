"""Raft's steady-state shortcuts (cluster/raft/adapter.py) and the stock paths they leave the
rest to.

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

from cluster.local import launcher
from cluster.raft import RaftDriver, RaftGroup
from tests.cluster.raft_harness import HashChain
from tests.cluster.test_raft_entries import started_group
from tests.polling import apoll_until

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
BURST = 40


class Replica:
    def __init__(self, host: str, port: int, peers: tuple[str, ...], directory: Path) -> None:
        self.host, self.port = host, port
        self.address = f"{host}:{port}"
        self.peers = peers
        self.directory = directory
        self.machine = HashChain()
        self.driver: RaftDriver | None = None
        self.group: RaftGroup | None = None

    async def start(self) -> None:
        self.machine = HashChain()  # a restart rebuilds it from the journal
        self.driver, self.group = await started_group(
            self.directory,
            self.machine,
            self.port,
            host=self.host,
            peers=self.peers,
            name="catch-up",
        )

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
    port = launcher.choose_ports(len(HOSTS), os.getpid())[2]
    replicas = [
        Replica(host, port, tuple(f"{h}:{port}" for h in HOSTS if h != host), tmp_path / host)
        for host in HOSTS
    ]
    try:
        for replica in replicas:
            await replica.start()
        await apoll_until(
            lambda: any(r.group and r.group.serving for r in replicas), 10, "a leader"
        )
        leader = next(r for r in replicas if r.group and r.group.serving)
        away = next(r for r in replicas if r is not leader)
        assert leader.group is not None

        assert leader.driver is not None
        mesh = leader.driver.mesh

        await propose_burst(leader.group, 0)  # all followers hold everything: the shortcuts
        away.stop()
        await propose_burst(leader.group, BURST)  # one follower gone: the stock walk
        await away.start()
        await apoll_until(lambda: mesh.is_open(away.address), 10, "the follower's link back")
        # Connected but behind: no shortcut to it; the walk brings it back and its stock
        # handler takes in what it lacks, while new entries keep coming.
        await propose_burst(leader.group, 2 * BURST)
        await apoll_until(lambda: away.machine.count == 3 * BURST, 10, "the follower caught up")
        await propose_burst(leader.group, 3 * BURST)  # all hold everything again: shortcuts

        total = 4 * BURST
        await apoll_until(
            lambda: all(r.machine.count == total for r in replicas),
            10,
            "every replica applying all",
        )
        expected = HashChain()
        for i in range(total):
            expected.apply(i.to_bytes(4, "big"))
        assert [r.machine.digest for r in replicas] == [expected.digest] * len(replicas)
    finally:
        for replica in replicas:
            if replica.driver is not None:
                replica.stop()
