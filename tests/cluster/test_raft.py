"""The pysyncobj hardening in cluster/raft/adapter/: the next-index rewind, fixed.

Stock pysyncobj 0.3.17 sets a follower's next index from every successful reply, so under
pipelining an old reply rewinds it: the follower is sent entries it holds, truncates entries it
may have applied, and sometimes stays stuck. Proven two ways: in process, step by step, with a
follower played by hand (and a negative control showing that stock pysyncobj fails that check
every time); and on a real 3-process group under pipelined load with frequent compaction,
where every replica must apply every command, in the same order (equal digests), without one
truncation warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pickle
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cluster.config import Timing
from cluster.local import launcher
from cluster.raft import RaftDriver, RaftGroup
from cluster.raft.adapter import PatchedSyncObj, replica
from cluster.raft.mesh import Mesh
from tests.cluster.procs import running, spawn
from tests.cluster.raft_harness import HashChain
from tests.polling import apoll_until, poll_until
from tests.raft_groups import loopback_mesh, started_group

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


# How long a replica may take to apply every command: 2-5 s here alone; in the full suite a
# follower was found short of the end at 40 s three times in one session (18,189, 18,711 and
# 18,558 of 20,000, the leader and the other follower done): under investigation, and a stall
# past this deadline still fails the test.
DEADLINE_S = "80"


def run_group(tmp_path: Path, *, commands: int, size: int) -> list[dict[str, Any]]:
    # A port free on all three addresses, below the kernel's ephemeral range.
    port = launcher.choose_ports(len(HOSTS), os.getpid())[2]
    addresses = ",".join(f"{h}:{port}" for h in HOSTS)
    tmp_path.mkdir(parents=True, exist_ok=True)
    reports = [tmp_path / f"report{i}.json" for i in range(3)]
    procs = [
        spawn(
            [
                "-m",
                "tests.cluster.raft_harness",
                "--index",
                str(i),
                "--addresses",
                addresses,
                "--dir",
                str(tmp_path / f"node{i}"),
                "--out",
                str(reports[i]),
                "--commands",
                str(commands),
                "--size",
                str(size),
                "--window",
                "2000",
                "--compaction",
                "300",
                "--deadline-s",
                DEADLINE_S,
                "--small-reads",
            ],
            tmp_path / f"node{i}.log",
        )
        for i in range(3)
    ]
    with running(procs), contextlib.suppress(TimeoutError):
        poll_until(lambda: all(r.exists() for r in reports), 100, "all three replica reports")
    # A replica stuck for good never reports: that is a finding, not an error of the test.
    return [
        json.loads(r.read_text()) if r.exists() else {"index": i, "stuck": True}
        for i, r in enumerate(reports)
    ]


def anomalies(reports: list[dict[str, Any]], commands: int) -> list[str]:
    found = []
    for r in reports:
        if r.get("stuck"):
            found.append(f"replica {r['index']} never reported: stuck")
            continue
        if r["count"] != commands:
            found.append(f"replica {r['index']} applied {r['count']} of {commands}")
        if r["truncations"]:
            found.append(f"replica {r['index']} truncated applied entries {r['truncations']}x")
        if r["failures"]:
            found.append(f"replica {r['index']}: {r['failures']} proposals failed")
        if not r["healthy"]:
            found.append(f"replica {r['index']} unhealthy: {r['detail']}")
    if len({r.get("digest") for r in reports}) != 1:
        found.append("replicas applied different logs")
    return found


@pytest.mark.alone  # its replicas apply 20,000 entries within the harness's deadline
def test_pipelined_load_with_compaction_keeps_every_replica_applying(tmp_path: Path) -> None:
    commands = 20_000
    reports = run_group(tmp_path, commands=commands, size=1_024)
    assert sum(r["proposed"] for r in reports) == 1
    assert anomalies(reports, commands) == []


class ScriptedFollower:
    """A follower played by hand over a real mesh link: it votes for any candidate, answers
    every append while `answering` (the entries after `prevLogIdx` are then all it holds), and
    keeps every append it got, in order."""

    def __init__(self, mesh: Mesh, leader: str, address: str) -> None:
        self.mesh = mesh
        self.leader = leader
        self.address = address
        self.answering = True
        self.appends: list[dict[str, Any]] = []
        self.term = 0  # the leader's, from its appends: a real follower's replies carry it

    def peer_connected(self, address: str) -> None:
        pass

    def peer_disconnected(self, address: str) -> None:
        pass

    def deliver(self, address: str, message: dict[str, Any]) -> None:
        if message["type"] == "request_vote":
            self.mesh.send(address, ROUTE, {"type": "response_vote", "term": message["term"]})
        elif message["type"] == "append_entries":
            self.appends.append(message)
            self.term = message["term"]
            if self.answering:
                self.answer(message["prevLogIdx"] + len(message["entries"]) + 1)

    def answer(self, next_index: int, term: int | None = None) -> None:
        """A successful reply: the follower holds everything before `next_index` (a reply
        to an append of `term`, the leader's by default)."""
        reply = {"type": "next_node_idx", "next_node_idx": next_index, "reset": False}
        stamp = self.term if term is None else term
        self.mesh.send(self.leader, ROUTE, {**reply, "success": True, "term": stamp})

    def holds(self, index: int) -> bool:
        return any(entry[1] == index for m in self.appends for entry in m["entries"])


ROUTE = "rewind"


@contextlib.asynccontextmanager
async def leader_and_scripted_follower(
    directory: Path,
) -> AsyncIterator[tuple[RaftGroup, ScriptedFollower]]:
    """A real group of two replicas, on 127.0.0.2 and .3, whose second replica is played by
    hand (`ScriptedFollower`) over a real mesh link; the real one leads."""
    port = launcher.choose_ports(2, os.getpid())[2]
    leader_at, follower_at = f"{HOSTS[0]}:{port}", f"{HOSTS[1]}:{port}"
    follower_driver = RaftDriver(Timing(), loopback_mesh(follower_at, frozenset({leader_at})))
    follower_driver.start()
    follower = ScriptedFollower(follower_driver.mesh, leader_at, follower_at)
    follower_driver.mesh.register(ROUTE, follower)
    driver, group = await started_group(
        directory, HashChain(), port, host=HOSTS[0], peers=(follower_at,), name=ROUTE
    )
    try:
        yield group, follower
    finally:
        driver.stop()
        follower_driver.stop()


async def check_an_old_reply_keeps_the_next_index(directory: Path) -> None:
    """The fix for the next-index rewind, in process: a leader pipelines five entries to its
    follower, then hears the reply to the first of them. Its next append to that follower
    must go on after the fifth, not resend what the follower holds: a follower sent entries
    from an earlier index truncates its log there (pysyncobj logs it, and once applied, the
    replicas' states may diverge)."""
    async with leader_and_scripted_follower(directory) as (group, follower):
        follower_at = follower.address
        sync = group._sync
        await apoll_until(
            lambda: (
                group.serving and sync.follower_match_indexes() == {follower_at: sync.log_index}
            ),
            10,
            "a leader whose follower holds its whole log",
        )
        follower.answering = False
        last = sync.log_index
        for i in range(5):  # in one turn of the loop: five appends in flight
            group.submit(i.to_bytes(4, "big"), 10, lambda _result, _error: None)
        await apoll_until(lambda: follower.holds(last + 5), 10, "the five appends")
        follower.answer(last + 2)  # the reply to the first, older than the leader's sends
        await apoll_until(
            lambda: sync.follower_match_indexes() == {follower_at: last + 1},
            10,
            "the leader to take the old reply in",
        )
        # Entry last+1 is now committed; the first append that says so left after the reply.
        told = await apoll_until(
            lambda: [m for m in follower.appends if m["commit_index"] > last],
            10,
            "the leader's next append",
        )
        after = told[0]
        assert after["prevLogIdx"] == last + 5, (
            f"an old reply rewound the follower's next index: the leader resent entries from "
            f"{after['prevLogIdx'] + 1} to a follower holding them up to {last + 5}, which "
            f"would truncate them"
        )


@pytest.mark.asyncio
async def test_an_old_reply_never_rewinds_a_followers_next_index(tmp_path: Path) -> None:
    await check_an_old_reply_keeps_the_next_index(tmp_path)


@pytest.mark.asyncio
async def test_negative_control_stock_pysyncobj_fails_that_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With pysyncobj's own message handler, the same check fails, every time."""
    stock = next(c for c in PatchedSyncObj.__mro__ if c.__module__ == "pysyncobj.syncobj")
    handler = vars(stock)["_SyncObj__onMessageReceived"]
    monkeypatch.setattr(PatchedSyncObj, "_SyncObj__onMessageReceived", handler)
    with pytest.raises(AssertionError, match="rewound the follower's next index"):
        await check_an_old_reply_keeps_the_next_index(tmp_path)


@pytest.mark.asyncio
async def test_a_reply_of_an_earlier_term_commits_nothing(tmp_path: Path) -> None:
    """A reply to an append of an earlier term (delivered late after a cut link healed, or
    sent to this node's earlier leadership) says nothing of the follower's log now: the
    leader must not count it. Here the only follower answers an entry only with such a
    reply: the entry stays uncommitted; the same reply in the leader's term commits it (the
    check's own control)."""
    async with leader_and_scripted_follower(tmp_path) as (group, follower):
        sync = group._sync
        await apoll_until(
            lambda: group.serving and sync.follower_match_indexes() == {follower.address:
                                                                         sync.log_index},
            10,
            "a leader whose follower holds its whole log",
        )  # fmt: skip
        follower.answering = False
        last, committed = sync.log_index, sync.raftCommitIndex
        group.submit(b"late", 10, lambda _result, _error: None)
        await apoll_until(lambda: follower.holds(last + 1), 10, "the append")
        follower.answer(last + 2, term=follower.term - 1)
        follower.answer(last + 2, term=follower.term + 1)
        await asyncio.sleep(0.3)  # a negative: nothing to poll for but the absence
        assert sync.raftCommitIndex == committed, "a reply of another term committed an entry"
        follower.answer(last + 2)
        await apoll_until(lambda: sync.raftCommitIndex > committed, 10, "the commit")


# -- what a peer sends never reaches pysyncobj's unpickling --------------------------------------

UNPICKLED: list[str] = []


def _unpickled(what: str) -> None:
    UNPICKLED.append(what)


class _Trap:
    """Unpickling it calls `_unpickled`: the proof that something was unpickled."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return _unpickled, (self.what,)


def hostile_messages(term: int, last: int) -> list[dict[str, Any]]:
    """What a peer holding the secret could send to get a pickle unpickled on a leader: a
    forwarded command and an appended entry without our prefix (stock pysyncobj unpickles
    regular entries when it applies them), and a chunked entry (joined and unpickled as soon
    as its last chunk arrives)."""
    foreign = bytes([0]) + pickle.dumps(_Trap("a foreign entry"))  # REGULAR, then a pickle
    chunk = pickle.dumps(_Trap("a chunked entry"))
    append = {"type": "append_entries", "term": term, "commit_index": 0}
    at = {"prevLogIdx": last, "prevLogTerm": term}
    return [
        {"type": "apply_command", "command": foreign},
        {**append, **at, "entries": [(foreign, last + 1, term)]},
        {**append, **at, "transmission": "start", "data": chunk},
        {**append, **at, "transmission": "finish", "data": b""},
    ]


async def send_hostile_messages(directory: Path) -> tuple[int, str]:
    """A leader hears `hostile_messages` from its peer over a real mesh link; the number of its
    log entries that were added by them, and its health detail afterwards."""
    async with leader_and_scripted_follower(directory) as (group, peer):
        sync = group._sync
        await apoll_until(lambda: group.serving, 10, "a leader")
        last, term = sync.log_index, group.status().term
        refused = sync.raftbroker_refused_messages
        for message in hostile_messages(term, last):
            assert peer.mesh.send(peer.leader, ROUTE, message)
        await apoll_until(
            lambda: UNPICKLED or sync.raftbroker_refused_messages >= refused + 4 or None,
            10,
            "the leader to take the four messages in",
        )
        return sync.log_index - last, group.status().detail


@pytest.mark.asyncio
async def test_a_peer_cannot_get_anything_unpickled(tmp_path: Path) -> None:
    UNPICKLED.clear()
    added, detail = await send_hostile_messages(tmp_path)
    assert UNPICKLED == []
    assert added == 0, "a foreign entry went into the log"
    assert "4 refused peer messages" in detail


@pytest.mark.asyncio
async def test_negative_control_without_the_screen_a_foreign_entry_reaches_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the screen, the append of a foreign entry puts it in the leader's log (its
    apply then asserts, stopping the replica; stock's would unpickle it)."""
    monkeypatch.setattr(replica, "refusal_of", lambda _message: None)  # where it is called
    async with leader_and_scripted_follower(tmp_path) as (group, peer):
        sync = group._sync
        await apoll_until(lambda: group.serving, 10, "a leader")
        last, term = sync.log_index, group.status().term
        foreign = hostile_messages(term, last)[1]
        assert peer.mesh.send(peer.leader, ROUTE, foreign)
        await apoll_until(lambda: sync.log_index > last, 10, "the foreign entry in the log")
        assert (
            sync._SyncObj__raftLog[last + 1 - sync._SyncObj__raftLog[0][1]][0]
            == (foreign["entries"][0][0])
        )
