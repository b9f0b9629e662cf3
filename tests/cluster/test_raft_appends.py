"""A follower takes its leader's appends by the Raft paper's rules (cluster/raft/adapter/
appends.py), where stock pysyncobj 0.3.17 breaks two: it deletes every entry after an append's
previous one whenever it holds any, even entries the append repeats, and it commits up to the
end of its own log rather than to the append's last entry.

A real replica follows a leader played by hand over a real mesh link, and is sent what a
real leader sends after a delayed, repeated or rewound append, and after a change of leader.
Each check has a negative control: stock pysyncobj's handler fails it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cluster.config import Timing
from cluster.local import launcher
from cluster.raft import RaftDriver
from cluster.raft.adapter import PatchedSyncObj
from cluster.raft.adapter.transport import ENTRY_PREFIX
from tests.cluster.raft_harness import HashChain
from tests.polling import apoll_until
from tests.raft_groups import loopback_mesh, started_group

HOSTS = ("127.0.0.2", "127.0.0.3")
ROUTE = "appends"
TERM = 1_000  # above any term the real replica reaches campaigning on its own meanwhile


class ScriptedLeader:
    """A leader played by hand: sends the appends it is told to, keeps every reply."""

    def __init__(self, driver: RaftDriver, follower: str) -> None:
        self.mesh = driver.mesh
        self.follower = follower
        self.replies: list[dict[str, Any]] = []
        self.connected = False

    def peer_connected(self, address: str) -> None:  # noqa: ARG002 - the endpoint's signature
        self.connected = True

    def peer_disconnected(self, address: str) -> None:
        pass

    def deliver(self, address: str, message: dict[str, Any]) -> None:  # noqa: ARG002
        if message["type"] == "next_node_idx":
            self.replies.append(message)

    async def append(
        self, term: int, prev: tuple[int, int], entries: list[int], commit: int, *, of: int = 0
    ) -> dict[str, Any]:
        """Send entries `entries` (their indexes; their term is `of`, else `term`) after
        the entry `prev` (index, term), and the follower's reply to it."""
        sent = len(self.replies)
        message = {
            "type": "append_entries",
            "term": term,
            "commit_index": commit,
            "prevLogIdx": prev[0],
            "prevLogTerm": prev[1],
            "entries": [(command(i, of or term), i, of or term) for i in entries],
        }
        assert self.mesh.send(self.follower, ROUTE, message)
        await apoll_until(lambda: len(self.replies) > sent, 10, "the follower's reply")
        return self.replies[sent]


def command(index: int, term: int) -> bytes:
    return ENTRY_PREFIX + f"{index}@{term}".encode()


def chain(*commands: bytes) -> bytes:
    """The digest `HashChain` reaches after applying `commands`."""
    digest = b"\x00" * 32
    for entry in commands:
        digest = hashlib.sha256(digest + entry[len(ENTRY_PREFIX) :]).digest()
    return digest


@contextlib.asynccontextmanager
async def follower_and_scripted_leader(
    directory: Path,
) -> AsyncIterator[tuple[PatchedSyncObj, HashChain, ScriptedLeader]]:
    port = launcher.choose_ports(2, os.getpid())[2]
    leader_at, follower_at = f"{HOSTS[0]}:{port}", f"{HOSTS[1]}:{port}"
    leader_driver = RaftDriver(Timing(), loopback_mesh(leader_at, frozenset({follower_at})))
    leader_driver.start()
    leader = ScriptedLeader(leader_driver, follower_at)
    leader_driver.mesh.register(ROUTE, leader)
    machine = HashChain()
    driver, group = await started_group(
        directory, machine, port, host=HOSTS[1], peers=(leader_at,), name=ROUTE
    )
    try:
        await apoll_until(lambda: leader.connected, 10, "the link to the follower")
        yield group._sync, machine, leader
    finally:
        driver.stop()
        leader_driver.stop()


async def check_a_repeated_append_keeps_the_entries_after_it(directory: Path) -> None:
    """A follower that applied entries 2-11 is sent entries 6-7 again (an append delivered
    late, or resent from a rewound next index). It holds them already: nothing is deleted,
    its reply covers what the append verified (up to 7), and entry 12 then goes on after 11."""
    async with follower_and_scripted_leader(directory) as (sync, machine, leader):
        reply = await leader.append(TERM, (1, 0), list(range(2, 12)), 11)
        assert reply["success"] and reply["next_node_idx"] == 12
        await apoll_until(lambda: sync.raftLastApplied == 11, 10, "entries 2-11 applied")
        reply = await leader.append(TERM, (5, TERM), [6, 7], 11)
        assert reply["success"] and reply["next_node_idx"] == 8, reply
        assert sync.log_index == 11, (
            f"a repeated append deleted entries the follower holds and applied: its log ends "
            f"at {sync.log_index}, not 11"
        )
        reply = await leader.append(TERM, (11, TERM), [12], 12)
        assert reply["success"] and reply["next_node_idx"] == 13
        await apoll_until(lambda: sync.raftLastApplied == 12, 10, "entry 12 applied")
        assert machine.digest == chain(*(command(i, TERM) for i in range(2, 13)))


async def check_entries_past_an_append_are_not_committed(directory: Path) -> None:
    """A follower holds entries 2-4 of term T, 2 committed; the leader of term T+1 (whose own
    entry 3 differs) says 3 is committed in an append that ends at 2. The follower's 3 is not
    known to be the leader's: it must not commit it. The next append replaces 3 and 4 by the
    new leader's 3, and the follower applies exactly the leader's entries."""
    async with follower_and_scripted_leader(directory) as (sync, machine, leader):
        await leader.append(TERM, (1, 0), [2, 3, 4], 2)
        await apoll_until(lambda: sync.raftLastApplied == 2, 10, "entry 2 applied")
        reply = await leader.append(TERM + 1, (2, TERM), [], 3)
        assert reply["success"] and reply["next_node_idx"] == 3, reply
        assert sync.raftCommitIndex == 2, (
            f"the follower committed its own entry {sync.raftCommitIndex}, past the append's "
            f"last, which the new leader does not hold"
        )
        reply = await leader.append(TERM + 1, (2, TERM), [3], 3)
        assert reply["success"] and reply["next_node_idx"] == 4
        assert sync.log_index == 3, "the conflicting entry 4 was kept"
        await apoll_until(lambda: sync.raftLastApplied == 3, 10, "the new entry 3 applied")
        assert machine.digest == chain(command(2, TERM), command(3, TERM + 1))


@pytest.mark.asyncio
async def test_a_repeated_append_keeps_the_entries_after_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.CRITICAL):
        await check_a_repeated_append_keeps_the_entries_after_it(tmp_path)
    assert "truncating already-applied" not in caplog.text


@pytest.mark.asyncio
async def test_entries_past_an_append_are_not_committed(tmp_path: Path) -> None:
    await check_entries_past_an_append_are_not_committed(tmp_path)


@pytest.fixture
def stock_appends(monkeypatch: pytest.MonkeyPatch) -> None:
    """pysyncobj's own handler for every message."""
    stock = next(c for c in PatchedSyncObj.__mro__ if c.__module__ == "pysyncobj.syncobj")
    handler = vars(stock)["_SyncObj__onMessageReceived"]
    monkeypatch.setattr(PatchedSyncObj, "_SyncObj__onMessageReceived", handler)


@pytest.mark.asyncio
@pytest.mark.usefixtures("stock_appends")
async def test_negative_control_stock_pysyncobj_deletes_repeated_entries(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="deleted entries the follower holds"):
        await check_a_repeated_append_keeps_the_entries_after_it(tmp_path)
