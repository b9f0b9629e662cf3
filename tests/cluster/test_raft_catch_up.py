"""Raft's steady-state shortcuts (cluster/raft/adapter/) and the stock paths they leave the
rest to.

A leader sends a new entry alone (`_send_new_entry`) only while every follower holds everything
before it, and a follower appends an append's entries at once only when they go right after
its last entry (`appends.take_append`'s fast path). A follower that was away breaks both: the
leader must fall back to pysyncobj's walk while it is gone and to bring it back, the follower
to the general rules for entries it lacks. Three real replicas on one loop, on loopback;
every one must end with every command, in order.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cluster.local import launcher
from cluster.raft import RaftDriver, RaftGroup, journal
from tests.cluster.raft_harness import HashChain
from tests.polling import apoll_until
from tests.raft_groups import started_group

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
BURST = 40


class Replica:
    def __init__(
        self,
        host: str,
        port: int,
        peers: tuple[str, ...],
        directory: Path,
        compaction_entries: int = 1_000_000,
        *,
        compaction_bytes: int = 1 << 30,
        durable: bool = False,
    ) -> None:
        self.host, self.port = host, port
        self.compaction_entries = compaction_entries
        self.compaction_bytes = compaction_bytes
        self.durable = durable
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
            compaction_entries=self.compaction_entries,
            compaction_bytes=self.compaction_bytes,
            durable=self.durable,
        )

    def stop(self) -> None:
        assert self.driver is not None
        self.driver.stop()
        self.driver = self.group = None


async def propose_burst(leader: RaftGroup, first: int) -> None:
    for i in range(first, first + BURST):  # one at a time: the steady state's shortcuts
        await leader.propose(i.to_bytes(4, "big"), timeout_s=10)


@contextlib.asynccontextmanager
async def three_replicas(
    directory: Path, port_seed: int, **options: Any
) -> AsyncIterator[tuple[list[Replica], Replica, Replica]]:
    """Three replicas started on this loop and one elected: (all, the leader, a follower);
    every replica still running is stopped at the end."""
    port = launcher.choose_ports(len(HOSTS), os.getpid() + port_seed)[2]
    peers = {host: tuple(f"{h}:{port}" for h in HOSTS if h != host) for host in HOSTS}
    replicas = [Replica(h, port, peers[h], directory / h, **options) for h in HOSTS]
    try:
        for replica in replicas:
            await replica.start()
        await apoll_until(
            lambda: any(r.group and r.group.serving for r in replicas), 10, "a leader"
        )
        leader = next(r for r in replicas if r.group and r.group.serving)
        yield replicas, leader, next(r for r in replicas if r is not leader)
    finally:
        for replica in replicas:
            if replica.driver is not None:
                replica.stop()


async def every_replica_holds(replicas: list[Replica], total: int) -> None:
    """Until every replica applied the first `total` commands of `propose_burst`, in order."""
    await apoll_until(
        lambda: all(r.machine.count == total for r in replicas), 10, "every replica applying all"
    )
    expected = HashChain()
    for i in range(total):
        expected.apply(i.to_bytes(4, "big"), 0)
    assert [r.machine.digest for r in replicas] == [expected.digest] * len(replicas)


def group_of(replica: Replica) -> RaftGroup:
    assert replica.group is not None
    return replica.group


@pytest.mark.asyncio
async def test_a_follower_away_and_back_gets_every_entry_through_the_stock_paths(
    tmp_path: Path,
) -> None:
    async with three_replicas(tmp_path, 0) as (replicas, leader, away):
        assert leader.driver is not None
        mesh = leader.driver.mesh
        await propose_burst(group_of(leader), 0)  # all followers hold everything: shortcuts
        away.stop()
        await propose_burst(group_of(leader), BURST)  # one follower gone: the stock walk
        await away.start()
        await apoll_until(lambda: mesh.is_open(away.address), 10, "the follower's link back")
        # Connected but behind: no shortcut to it; the walk brings it back and its stock
        # handler takes in what it lacks, while new entries keep coming.
        await propose_burst(group_of(leader), 2 * BURST)
        await apoll_until(lambda: away.machine.count == 3 * BURST, 10, "the follower caught up")
        await propose_burst(group_of(leader), 3 * BURST)  # all hold everything: shortcuts
        await every_replica_holds(replicas, 4 * BURST)


COMPACTION_ENTRIES = 20


@pytest.mark.asyncio
async def test_a_follower_whose_dump_is_damaged_gets_the_state_from_its_leader(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A follower's dump (the snapshot its log was compacted to) with one flipped bit is
    refused at its restart in one line, never loaded: moved aside, its log emptied, and the
    leader sends it the group's state again, so it ends with every command, as the others.
    (Without the check, pysyncobj logs a traceback for the dump it cannot load.)"""
    options = {"compaction_entries": COMPACTION_ENTRIES}
    async with three_replicas(tmp_path, 1, **options) as (replicas, leader, away):
        await propose_burst(group_of(leader), 0)
        dump = away.directory / journal.DUMP_NAME
        await apoll_until(dump.exists, 10, "the follower's log compacted to a dump")
        away.stop()
        data = bytearray(dump.read_bytes())
        data[len(data) // 2] ^= 0x04
        dump.write_bytes(bytes(data))
        await propose_burst(group_of(leader), BURST)
        await away.start()
        await propose_burst(group_of(leader), 2 * BURST)
        await every_replica_holds(replicas, 3 * BURST)
    assert (away.directory / (journal.DUMP_NAME + ".damaged")).exists()
    refusals = [r for r in caplog.records if "its dump is refused" in r.getMessage()]
    assert len(refusals) == 1 and "checksum" in refusals[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info], "a traceback: the dump was loaded"


class AckCounter:
    """Counts the acknowledgements (`next_node_idx`) replicas send, and those that left while
    the sender's journal held entries not yet synced."""

    def __init__(self) -> None:
        self.acks = 0
        self.unsynced = 0

    def observe(self, replica: Replica) -> None:
        file = group_of(replica)._sync.raftbroker_journal.file
        assert replica.driver is not None
        send = replica.driver.mesh.send

        def observed(address: str, group: str, message: dict[str, Any]) -> bool:
            if message["type"] == "next_node_idx":
                self.acks += 1
                self.unsynced += file.dirty
            return send(address, group, message)

        replica.driver.mesh.send = observed  # type: ignore[method-assign]


async def acks_sent_unsynced(directory: Path, *, durable: bool) -> AckCounter:
    """Three replicas, one away and back (so that both the fast path and pysyncobj's handler
    append and acknowledge), observed."""
    counter = AckCounter()
    async with three_replicas(directory, 2, durable=durable) as (replicas, leader, away):
        for replica in replicas:
            counter.observe(replica)
        await propose_burst(group_of(leader), 0)
        away.stop()
        await propose_burst(group_of(leader), BURST)
        await away.start()
        counter.observe(away)
        await propose_burst(group_of(leader), 2 * BURST)
        await every_replica_holds(replicas, 3 * BURST)
    return counter


@pytest.mark.asyncio
async def test_with_fsync_a_follower_acknowledges_only_what_it_synced(tmp_path: Path) -> None:
    durable = await acks_sent_unsynced(tmp_path / "durable", durable=True)
    assert durable.acks >= 2 * BURST
    assert durable.unsynced == 0
    # The control: without fsync, acknowledgements leave with their entries not synced.
    relaxed = await acks_sent_unsynced(tmp_path / "relaxed", durable=False)
    assert relaxed.unsynced >= BURST, (relaxed.acks, relaxed.unsynced)


LOG_BYTES_MAX = 256 * 1024
LARGE_COMMAND_BYTES = 32 * 1024


@pytest.mark.asyncio
async def test_a_log_of_large_entries_is_compacted_by_its_bytes(tmp_path: Path) -> None:
    """Large entries (a Kafka batch is up to a MB) compact the log by its bytes, long before
    its entry count would: each journal, in its file and in memory, stays near its bound
    (a log that only grows costs memory and fresh pages), and every replica still applies
    every command, in order. Without the bound, 200 entries of 32 KiB stay in every log."""
    options = {"compaction_bytes": LOG_BYTES_MAX}
    async with three_replicas(tmp_path, 2, **options) as (replicas, leader, _follower):
        commands = [i.to_bytes(4, "big") * (LARGE_COMMAND_BYTES // 4) for i in range(200)]
        largest = 0
        for command in commands:
            await group_of(leader).propose(command, timeout_s=10)
            largest = max(largest, *(journal_bytes(r) for r in replicas))
        expected = HashChain()
        for command in commands:
            expected.apply(command, 0)
        await apoll_until(
            lambda: all(r.machine.digest == expected.digest for r in replicas),
            10,
            "every replica applying every command",
        )
    # The bound, then the entries appended before the next tick compacts, with headroom.
    assert largest <= 2 * LOG_BYTES_MAX, f"a journal held {largest} bytes"


def journal_bytes(replica: Replica) -> int:
    return group_of(replica).status().log_bytes
