"""Raft groups: the only module that imports pysyncobj.

A `RaftGroup` replicates `bytes` commands and applies them, in log order, to a
`ReplicatedMachine`; `propose()` returns the apply result on the caller's event loop, or raises
`ProposalError` with a retriable `ErrorCode` when leadership is lost, the queue is full or the
proposal times out. A command goes into the log as it is, behind a two-byte prefix: no pickle.

Threads: none of its own. One `RaftDriver` per process ticks every group (pysyncobj with
`autoTick=False`) on the asyncio loop that serves clients, and watches the mesh's sockets there:
idle cost grows per group by a few dict lookups, not by a thread, and a write crosses no thread
on its way from the client to the log and back. Machines are applied, snapshotted and read only
on that loop, so a read between two awaits sees a machine between two applies.

Hardening of pysyncobj 0.3.17 (pinned in pyproject.toml; see DESIGN.md):
- its leader sets a follower's next index to the index in each successful reply, so under
  pipelining an old reply rewinds it and the follower truncates entries it already applied;
  `_PatchedSyncObj` keeps the larger of the old and new index (the whole fix);
- peer traffic goes through our own transport, `cluster/mesh.py` (one authenticated, encrypted
  connection per node pair for every group, msgpack frames), not pysyncobj's (a connection and
  port per group, bound to 0.0.0.0, every message pickled, zlib-compressed and Fernet-wrapped);
  large entries travel whole, never as pysyncobj's pickled chunks with a round trip each;
- journal together with a full dump file, a regular compaction bound, a short leader fallback,
  batching off for latency;
- snapshots go through our own serializer: the machine's canonical bytes plus pysyncobj's two
  boundary entries, encoded with msgpack, never a pickle of the machine.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj.journal import FileJournal, ResizableFile
from pysyncobj.monotonic import monotonic as pysyncobj_clock
from pysyncobj.node import Node, TCPNode
from pysyncobj.syncobj import _COMMAND_TYPE, _RAFT_STATE
from pysyncobj.transport import Transport

from cluster.config import Timing
from cluster.raft.mesh import ERROR, READ, WRITE, Mesh, MeshSettings
from statemachine.codec import CodecError, pack, unpack
from statemachine.errors import ErrorCode

log = logging.getLogger(__name__)
T = TypeVar("T")

SNAPSHOT_FORMAT = 1
# A log entry of ours: pysyncobj's type byte for a regular command, then a mark of our own.
_ENTRY_PREFIX = bytes([_COMMAND_TYPE.REGULAR]) + b"R"
_NOT_LEADER = frozenset(
    {
        FAIL_REASON.MISSING_LEADER,
        FAIL_REASON.DISCARDED,
        FAIL_REASON.NOT_LEADER,
        FAIL_REASON.LEADER_CHANGED,
    }
)
# A leader tells followers of new commits this long after applying them (all of that moment's),
# unless appends went out meanwhile: under a steady stream of writes every commit travels with
# the next append, and the news waits until the stream stops.
COMMIT_NEWS_DELAY_S = 0.005
# A follower applies what a leader's append newly committed this long after answering it, not
# in the same turn: right after its answer the leader needs the CPU to commit and reply. And in
# batches: each apply is a tick, and both followers, told of commits together, tick together.
# Every 10 ms rather than every 2 ms took sequential produce p50 from 0.37-0.39 ms to
# 0.33-0.34 ms and a follower's CPU per write by a fifth (2 cores); it costs a follower's
# machine and store that much lag behind the commit, which a new leader applies before it
# serves (the term-start barrier).
FOLLOWER_APPLY_DELAY_S = 0.010
# A replica whose applied index trails its commit index for this long is reported unhealthy.
STALL_REPORT_S = 5.0


class ReplicatedMachine(Protocol):
    """What a Raft group applies: deterministic, called only by the driver, on its loop."""

    def apply(self, command: bytes) -> object: ...

    def settle(self) -> None:
        """After a run of applies, once their proposers heard: carry out what they left."""

    def snapshot(self) -> bytes: ...

    def restore(self, data: bytes) -> None: ...


class ProposalError(Exception):
    """A proposal that did not produce a result; `error` is retriable, `leader` a hint."""

    def __init__(self, error: ErrorCode, leader: str | None = None) -> None:
        super().__init__(error.name)
        self.error = error
        self.leader = leader


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """One replica of a group: its name, its Raft address and its peers' Raft addresses.

    `route` names the group on the wire and must never name another group, even a deleted one
    of the same name: a replica left behind would otherwise talk to its successor.
    """

    name: str
    self_address: str
    peer_addresses: tuple[str, ...]
    directory: Path
    route: str


@dataclass(frozen=True, slots=True)
class GroupStatus:
    name: str
    is_leader: bool
    serving: bool
    leader_address: str | None
    term: int
    commit_index: int
    last_applied: int
    healthy: bool
    detail: str


def _sync_conf(
    spec: GroupSpec,
    *,
    timing: Timing,
    compaction_entries: int,
    entries_bytes_max: int,
    serializer: Callable[[str, Any], None],
    deserializer: Callable[[str], Any],
) -> SyncObjConf:
    spec.directory.mkdir(parents=True, exist_ok=True)
    return SyncObjConf(
        autoTick=False,
        appendEntriesUseBatch=False,
        # Entries per message up to this size. Below it pysyncobj would send one large entry as
        # pickled chunks, each answered before the next (a round trip per 64 KiB by default).
        appendEntriesBatchSizeBytes=entries_bytes_max,
        appendEntriesPeriod=timing.heartbeat_ms / 1000,
        raftMinTimeout=timing.election_timeout_ms_min / 1000,
        raftMaxTimeout=timing.election_timeout_ms_max / 1000,
        leaderFallbackTimeout=timing.leader_fallback_ms / 1000,
        connectionTimeout=timing.connection_timeout_ms / 1000,
        connectionRetryTime=timing.connection_retry_ms / 1000,
        journalFile=str(spec.directory / "raft.journal"),
        fullDumpFile=str(spec.directory / "raft.dump"),
        serializer=serializer,
        deserializer=deserializer,
        logCompactionMinEntries=compaction_entries,
        logCompactionMinTime=60,
        commandsQueueSize=0,  # we bound the queue ourselves, per group, in RaftGroup
        # pysyncobj spins on the constructing thread between bind attempts: keep it short, the
        # node retries a group that failed to start later, without blocking the others.
        bindRetryTime=0.1,
        maxBindRetries=3,
        dynamicMembershipChange=False,
        useFork=False,
    )


class _GroupPolls:
    """The poller a group sees: it never polls, and nothing it registers is ever watched.

    Every group's `doTick` ends with a `poll` of its own poller, and its pipe notifier registers
    there; both are the driver's business (it watches the mesh's sockets on the event loop and
    is told of proposals directly), so this poller only absorbs the calls.
    """

    def subscribe(self, descr: int, callback: Any, event_mask: int) -> None:
        pass

    def unsubscribe(self, descr: int) -> None:
        pass

    def poll(self, timeout: float) -> None:
        pass


class _LoopPoller:
    """The mesh's poller on the event loop: readiness callbacks from `add_reader`/`add_writer`.

    An error on a socket shows as readable, and the read then fails.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._masks: dict[int, int] = {}

    def subscribe(self, descr: int, callback: Callable[[int, int], None], mask: int) -> None:
        old = self._masks.get(descr, 0)
        self._masks[descr] = mask
        wants_read, wanted_read = bool(mask & (READ | ERROR)), bool(old & (READ | ERROR))
        if wants_read and not wanted_read:
            self._loop.add_reader(descr, self._fire, callback, descr, READ)
        elif wanted_read and not wants_read:
            self._loop.remove_reader(descr)
        if mask & WRITE and not old & WRITE:
            self._loop.add_writer(descr, self._fire, callback, descr, WRITE)
        elif old & WRITE and not mask & WRITE:
            self._loop.remove_writer(descr)

    def unsubscribe(self, descr: int) -> None:
        if self._masks.pop(descr, None) is not None:
            self._loop.remove_reader(descr)
            self._loop.remove_writer(descr)

    def _fire(self, callback: Callable[[int, int], None], descr: int, event: int) -> None:
        if descr in self._masks:  # not unsubscribed by an earlier callback of this turn
            callback(descr, event)


class _MeshTransport(Transport):  # type: ignore[misc]
    """pysyncobj's transport for one group: a view of the process-wide `Mesh`.

    It registers with the mesh when pysyncobj first asks it to get ready (pysyncobj sets its
    callbacks after constructing the transport, so connection news must wait until then).
    """

    def __init__(self, sync_obj: Any, self_node: Any, other_nodes: Any) -> None:
        sync_obj._poller = _GroupPolls()
        super().__init__(sync_obj, self_node, other_nodes)
        self._sync_obj = sync_obj
        self._mesh: Mesh = sync_obj.raftbroker_mesh
        self._group: str = sync_obj.raftbroker_group
        self._nodes: dict[str, Any] = {node.address: node for node in other_nodes}
        self._registered = False

    @property
    def ready(self) -> bool:
        return self._registered

    def tryGetReady(self) -> None:  # noqa: N802
        if not self._registered:
            self._registered = True
            self._mesh.register(self._group, self)

    def send(self, node: Any, message: dict[str, Any]) -> bool:
        return self._mesh.send(node.address, self._group, message)

    def destroy(self) -> None:
        self._mesh.unregister(self._group)

    # -- the mesh's Endpoint ---

    def peer_connected(self, address: str) -> None:
        node = self._nodes.get(address)
        if node is not None:
            self._onNodeConnected(node)
            self._sync_obj.raftbroker_wake()

    def peer_disconnected(self, address: str) -> None:
        node = self._nodes.get(address)
        if node is not None:
            self._onNodeDisconnected(node)
            self._sync_obj.raftbroker_wake()

    def deliver(self, address: str, message: dict[str, Any]) -> None:
        node = self._nodes.get(address)
        if node is None:
            return
        sync = self._sync_obj
        kind = message.get("type")
        # Known before the message is taken in: it may make a leader or candidate a follower.
        heard = Heard.APPEND if kind == "append_entries" and not sync._isLeader() else Heard.OTHER
        try:
            self._onMessageReceived(node, message)
        except Exception:
            # A peer holds the secret, so this is a bug or a broken replica, not an attack; it
            # must not take the driver (and every other group) down with it, and it
            # must show: it counts as a failed tick, which makes the group report unhealthy.
            sync.raftbroker_tick_errors += 1
            _log_failure(sync, f"group {self._group}: a message from {address} failed")
        else:
            if kind == "next_node_idx" and sync.holds_every_entry(node):
                heard = Heard.ACK_CAUGHT_UP
        sync.raftbroker_heard(heard)


def _log_failure(sync_obj: Any, what: str) -> None:
    """Log a recurring failure of a group at its 1st, 10th, 100th, ... occurrence."""
    count = sync_obj.raftbroker_tick_errors
    if count in (1, 10, 100, 1_000, 10_000):
        log.exception("%s (%d failures so far)", what, count)


class Heard(Enum):
    """What a peer's message was, for the driver to decide whether its group needs a tick."""

    APPEND = "an append, taken in by a follower"
    ACK_CAUGHT_UP = "a leader heard a follower that now holds its whole log"
    OTHER = "anything else"


class _Node(TCPNode):  # type: ignore[misc]
    """A replica's address, as pysyncobj keys its tables: equal to a stock node of the same
    address and hashed alike, but the hash is kept. pysyncobj hashes nodes some thirty times
    a write, each a `__hash__` and an `id` property in Python."""

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self._hash = hash(address)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        # The stock comparison reads the `id` property of both sides, in Python; a follower
        # compares its leader with the sender of every append.
        return self is other or (isinstance(other, Node) and self._id == other.id)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)


class _Notifier:
    def __init__(self, notify: Callable[[], None]) -> None:
        self.notify = notify


class _MappedJournalFile(ResizableFile):  # type: ignore[misc]
    """pysyncobj's journal file, minus two fstat calls per entry.

    The stock `write` asks the mapping for its size before every write (`mmap.size()` is an
    fstat), and the journal writes twice per entry: the record, then the offset of the last
    one. The mapping always spans the whole file (mapped with length 0, resized together), so
    its length, known without a syscall, is the file's size; growing stays the stock way.
    """

    def write(self, offset: int, values: bytes) -> None:
        mapping = self._ResizableFile__mm
        end = offset + len(values)
        if end > len(mapping):
            super().write(offset, values)
        else:
            mapping[offset:end] = values


class _PatchedSyncObj(SyncObj):  # type: ignore[misc]
    """A SyncObj applying bytes to one machine, with the next-index rewind fixed."""

    def __init__(
        self,
        machine: ReplicatedMachine,
        spec: GroupSpec,
        conf: SyncObjConf,
        mesh: Mesh,
        *,
        wake: Callable[[_PatchedSyncObj], None],
        heard: Callable[[_PatchedSyncObj, Heard], None],
        commit_news: Callable[[_PatchedSyncObj], None],
    ) -> None:
        self.raftbroker_machine = machine
        self.raftbroker_mesh = mesh
        self.raftbroker_group = spec.route
        self.raftbroker_tick_errors = 0
        self.raftbroker_leading = False
        self.raftbroker_live = False  # until constructed: the driver ticks only live groups
        # Called when this replica stops leading (set by RaftGroup).
        self.raftbroker_on_deposed: Callable[[], None] | None = None
        self.raftbroker_wake = partial(wake, self)
        self.raftbroker_heard = partial(heard, self)
        self.raftbroker_proposing = False  # in propose(): queued commands are taken at once
        self.raftbroker_commit_news = commit_news
        self.raftbroker_commit_sent = 0  # the commit index the last appends carried
        self._append_period_s = conf.appendEntriesPeriod
        self._chunk_bytes = conf.appendEntriesBatchSizeBytes  # the stock walk chunks from here
        super().__init__(
            spec.self_address,
            list(spec.peer_addresses),
            conf,
            nodeClass=_Node,
            transportClass=_MeshTransport,
        )
        # pysyncobj wakes its ticking thread with a pipe per group when a command is queued;
        # here the proposer is on the driver's own loop and marks the group due instead.
        stock: Any = vars(self)["_SyncObj__pipeNotifier"]
        os.close(stock._PipeNotifier__pipeR)
        os.close(stock._PipeNotifier__pipeW)
        self._SyncObj__pipeNotifier = _Notifier(self._command_queued)
        journal = vars(self)["_SyncObj__raftLog"]
        assert isinstance(journal, FileJournal), "every group has a journal file"
        assert type(journal._FileJournal__journalFile) is ResizableFile
        journal._FileJournal__journalFile.__class__ = _MappedJournalFile
        self.raftbroker_live = True

    @replicated  # type: ignore[untyped-decorator]
    def apply_command(self, command: bytes) -> object:
        """Entries written before commands went into the log as they are (a pickled call of
        this method): still applied from an old journal."""
        return self.raftbroker_machine.apply(command)

    def _SyncObj__doApplyCommand(self, entry: bytes) -> object:  # noqa: N802
        # An entry is pysyncobj's type byte, our mark and the command as it is: no pickle of a
        # method call to build on the leader and take apart on every replica. An old entry
        # has a pickle after the type byte, which starts with PROTO (0x80), never the mark.
        if entry[:2] == _ENTRY_PREFIX:
            return self.raftbroker_machine.apply(entry[2:])
        return SyncObj._SyncObj__doApplyCommand(self, entry)

    def _command_queued(self) -> None:
        if not self.raftbroker_proposing:
            self.raftbroker_wake()

    def propose_now(self, command: bytes, callback: Callable[[object, int], None]) -> None:
        """Take a command at once, in this turn of the loop rather than the next tick's: a
        leader appends and sends it, a follower forwards it (through pysyncobj's queue)."""
        queued: Any = self._SyncObj__commandsQueue._FastQueue__queue
        if self._isLeader() and not queued:
            self._append_as_leader(_ENTRY_PREFIX + command, callback)
        else:
            self.raftbroker_proposing = True
            try:
                self._applyCommand(_ENTRY_PREFIX + command, callback)
                self._checkCommandsToApply()
            finally:
                self.raftbroker_proposing = False
        # Left queued (no leader known yet), or appended where a tick commits it (a group of
        # one replica): a tick's business. Else it is on its way to the followers already.
        if queued or self.has_work:
            self.raftbroker_wake()

    def _append_as_leader(self, entry: bytes, callback: Callable[[object, int], None]) -> None:
        # `_checkCommandsToApply`'s leader branch for one local command (no membership
        # changes here), without the trip through its queue: a put, a get, a queue.Empty
        # raised and caught, and four clock reads per proposal. The entry goes to the followers
        # before the leader's own journal takes it, as etcd's leaders do: the leader counts
        # itself as a holder only when it commits, in a later event, after both.
        log: Any = self._SyncObj__raftLog
        previous = log[-1]
        index, term = previous[1] + 1, self._SyncObj__raftCurrentTerm
        sent = self._send_new_entry(log, (entry, index, term), previous)
        log.add(entry, index, term)
        self._SyncObj__commandsWaitingCommit[index].append((term, callback))
        if not sent:
            self._SyncObj__sendAppendEntries()

    def _send_new_entry(
        self, log: Any, entry: tuple[bytes, int, int], previous: tuple[bytes, int, int]
    ) -> bool:
        """On a leader whose followers all hold everything up to `previous`, its last entry:
        send each the new `entry` alone, as pysyncobj's `__sendAppendEntries` would, without
        its general walk (slices of the journal per follower, chunking, snapshots). False, and
        nothing sent, in any other case (a follower behind or away, an entry the stock walk
        would send in chunks, the log's first entry), which the stock walk then handles."""
        index = entry[1]
        first, others = log[0][1], self._SyncObj__otherNodes
        next_indexes: dict[Any, int] = self._SyncObj__raftNextIndex
        connected = self._SyncObj__connectedNodes
        if index - 1 <= first or self._SyncObj__readonlyNodes or len(entry[0]) >= self._chunk_bytes:
            return False
        for node in others:
            if node not in connected or next_indexes.get(node) != index:
                return False
        self.raftbroker_commit_sent = self._SyncObj__raftCommitIndex
        message = {
            "type": "append_entries",
            "term": entry[2],
            "commit_index": self.raftbroker_commit_sent,
            "entries": [entry],
            "prevLogIdx": index - 1,
            "prevLogTerm": previous[2],
        }
        self._SyncObj__newAppendEntriesTime = pysyncobj_clock() + self._append_period_s
        transport = self._SyncObj__transport
        for node in others:
            next_indexes[node] = index + 1
            transport.send(node, message)
        return True

    def holds_every_entry(self, node: Any) -> bool:
        """On a leader: `node` acknowledged the whole log, so nothing is left to send it."""
        if not self._isLeader():
            return False
        match: dict[Any, int] = self._SyncObj__raftMatchIndex
        return match.get(node, -1) >= self.log_index

    def can_commit(self) -> bool:
        """On a leader: a majority holds an entry past the commit index, so a tick commits."""
        if not self._isLeader():
            return False
        index = self.raftCommitIndex + 1
        return index <= self.log_index and self._majority_holds(index)

    def _majority_holds(self, index: int) -> bool:
        """On a leader: the entry at `index` is held by a majority (the leader counts)."""
        match: dict[Any, int] = self._SyncObj__raftMatchIndex
        holders = 1 + sum(1 for held in match.values() if held >= index)
        return 2 * holders > len(match) + 1

    def commit_now(self) -> None:
        """On a leader: the commit and apply of a tick, alone. When an acknowledgement lets a
        leader commit, its proposers wait for just this; the rest of a tick (heartbeats, the
        quorum check, compaction, queued commands) is the timer's and the cycle's business."""
        if not self._isLeader():
            return
        log: Any = self._SyncObj__raftLog
        term: int = self._SyncObj__raftCurrentTerm
        first_index, last_index = log[0][1], log[-1][1]
        index = committed = self.raftCommitIndex
        while index < last_index:
            index += 1
            if not self._majority_holds(index):
                break
            # Raft 5.4.2: counting replicas commits only an entry of the leader's own term
            # (and with it every entry before it).
            if index >= first_index and log[index - first_index][2] == term:
                committed = index
        if committed != self.raftCommitIndex:
            self._SyncObj__raftCommitIndex = committed
            log.setRaftCommitIndex(committed)
        self._SyncObj__leaderCommitIndex = committed
        self._SyncObj__applyLogEntries()

    @property
    def has_work(self) -> bool:
        """A tick would commit or apply something now."""
        return self.raftCommitIndex > self.raftLastApplied or self.can_commit()

    def _SyncObj__onMessageReceived(self, node: Any, message: dict[str, Any]) -> None:  # noqa: N802
        kind = message.get("type")
        if kind == "append_entries" and self._extends_log(node, message):
            self._on_append(node, message)
        elif kind == "next_node_idx" and self._isLeader():
            self._on_reply(node, message)
        else:
            SyncObj._SyncObj__onMessageReceived(self, node, message)

    def _extends_log(self, node: Any, message: dict[str, Any]) -> bool:
        """A follower hears its leader of this term send entries that go right after its last
        one: the steady state, where nothing is truncated, chunked or installed."""
        last = self._SyncObj__raftLog[-1]
        return (
            message["term"] == self._SyncObj__raftCurrentTerm
            and self._SyncObj__raftState == _RAFT_STATE.FOLLOWER
            and self._SyncObj__raftLeader == node
            and not self._SyncObj__transferInProgress
            and "transmission" not in message
            and message.get("prevLogIdx") == last[1]
            and message.get("prevLogTerm") == last[2]
        )

    def _on_append(self, node: Any, message: dict[str, Any]) -> None:
        """pysyncobj's follower branch for an append that `_extends_log`, alone: the stock
        one first walks past other message types, slices the journal to find the previous
        entry, and reads the last index three times. Same effects, same answer."""
        self._SyncObj__raftElectionDeadline = (
            pysyncobj_clock() + self._SyncObj__generateRaftTimeout()
        )
        log: Any = self._SyncObj__raftLog
        for entry in message["entries"]:
            log.add(*entry)
        last_index: int = log[-1][1]
        self._SyncObj__transport.send(
            node,
            {
                "type": "next_node_idx",
                "next_node_idx": last_index + 1,
                "reset": False,
                "success": True,
            },
        )
        leader_commit: int = message["commit_index"]
        self._SyncObj__leaderCommitIndex = leader_commit
        if leader_commit > self._SyncObj__raftCommitIndex:
            self._SyncObj__raftCommitIndex = min(leader_commit, last_index)
            log.setRaftCommitIndex(self._SyncObj__raftCommitIndex)

    def _on_reply(self, node: Any, message: dict[str, Any]) -> None:
        """On a leader: a follower's reply to an append. pysyncobj's leader branch, which is
        the only one that takes it, without the walk past every other message type first;
        and with a fix: the stock leader assigns a follower's next index from every
        successful reply, so with pipelined appends an older reply rewinds it, and the
        follower is then sent entries it already holds and truncates (DESIGN.md). The larger
        index is kept."""
        next_index: int = message["next_node_idx"]
        next_indexes: dict[Any, int] = self._SyncObj__raftNextIndex
        if message["reset"]:
            next_indexes[node] = next_index
        if message["success"]:
            match: dict[Any, int] = self._SyncObj__raftMatchIndex
            if match[node] < next_index - 1:
                match[node] = next_index - 1
                next_indexes[node] = max(next_indexes.get(node, next_index), next_index)
        self._SyncObj__lastResponseTime[node] = pysyncobj_clock()

    def _SyncObj__applyLogEntries(self) -> bool:  # noqa: N802
        # Unbatched, the stock leader sends every follower an append right after each apply,
        # only to tell it the new commit index: two sends in the same tick, before the
        # proposer hears its result. The driver sends that news a moment later instead, for
        # every apply of that moment at once (`RaftDriver._tell_commits`).
        try:
            if SyncObj._SyncObj__applyLogEntries(self) and self._isLeader():
                self.raftbroker_commit_news(self)
        finally:
            self.raftbroker_machine.settle()
        return False

    def send_commit_index(self) -> None:
        """On a leader: an append to every follower, which carries the commit index."""
        if self._isLeader():
            self._SyncObj__sendAppendEntries()

    def _SyncObj__sendAppendEntries(self) -> None:  # noqa: N802
        self.raftbroker_commit_sent = self._SyncObj__raftCommitIndex
        SyncObj._SyncObj__sendAppendEntries(self)

    def commit_news(self, quiet_s: float) -> bool | None:
        """On a leader, whether followers must be told the commit index now: False when the
        last appends carried it (or this is no leader), None while appends went out within
        `quiet_s` (the next ones will carry it: ask again later), True otherwise."""
        if not self._isLeader() or self.raftbroker_commit_sent >= self._SyncObj__raftCommitIndex:
            return False
        last_sent = self._SyncObj__newAppendEntriesTime - self._append_period_s
        return None if pysyncobj_clock() - last_sent < quiet_s else True

    def follower_match_indexes(self) -> dict[str, int]:
        """On a leader: each follower's replicated index, by Raft address (a copy)."""
        if not self._isLeader():
            return {}
        match: dict[Any, int] = self._SyncObj__raftMatchIndex
        return {str(node.address): index for node, index in list(match.items())}

    @property
    def log_index(self) -> int:
        index: int = self._SyncObj__getCurrentLogIndex()
        return index

    @property
    def noop_index(self) -> int | None:
        index: int | None = self._SyncObj__noopIDx
        return index


class RaftDriver:
    """Ticks every Raft group of a process, on the event loop that serves its clients.

    A group is ticked when something concerns it (a message, a proposal, a peer coming or
    going), in the same turn of the loop, and every group on a timer; a group left with work
    after a tick (an entry to commit or apply) is ticked once more, because pysyncobj commits
    and applies at the start of a tick what the end of the previous one appended. One thread
    for clients and Raft: no hand-offs between threads on the path of a write (they were a
    third of its latency).
    """

    def __init__(self, timing: Timing, mesh: MeshSettings, compaction_entries: int = 2_000) -> None:
        self.timing = timing
        self.compaction_entries = compaction_entries
        # A message carries entries up to half a mesh frame, so one more entry still fits.
        self.entries_bytes_max = mesh.frame_bytes_max // 2
        self._mesh_settings = mesh
        self._mesh: Mesh | None = None
        self._groups: dict[str, _PatchedSyncObj] = {}
        self._due: dict[_PatchedSyncObj, None] = {}  # ordered, so ticks follow arrival order
        self._cycle_soon: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._news: dict[_PatchedSyncObj, None] = {}
        self._news_timer: asyncio.TimerHandle | None = None
        self._late: set[_PatchedSyncObj] = set()
        self._late_timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.tick_s = min(timing.heartbeat_ms / 4000, 0.025)

    @property
    def mesh(self) -> Mesh:
        assert self._mesh is not None, "driver not started"
        return self._mesh

    def start(self) -> None:
        """On the event loop: bind the Raft port (OSError if it is taken) and start ticking."""
        loop = self._loop = asyncio.get_running_loop()
        self._mesh = Mesh(self._mesh_settings, _LoopPoller(loop))
        self._mesh.bind()
        self._timer = loop.call_later(self.tick_s, self._on_timer)

    def stop(self) -> None:
        for handle in (self._timer, self._cycle_soon, self._news_timer, self._late_timer):
            if handle is not None:
                handle.cancel()
        if self._news and self._mesh is not None:
            # Followers learn the last commits before the links close.
            self._tell_commits(final=True)
        for group in list(self._groups.values()):
            group.raftbroker_live = False
            group.destroy()
        self._groups.clear()
        self._due.clear()
        if self._mesh is not None:
            self._mesh.close()

    def _wake(self, group: _PatchedSyncObj) -> None:
        self._due[group] = None
        self._schedule()

    def _heard(self, group: _PatchedSyncObj, heard: Heard) -> None:
        """`group` took in a peer's message. A follower answered an append inside it, and
        applies what it newly committed a moment later. An acknowledgement that lets a leader
        commit is acted on at once: its proposer waits, and in this same turn the other
        followers' acknowledgements would otherwise be read and handled first. One from a
        follower that holds the whole log, and commits nothing, needs no tick (the timer's
        ticks keep the heartbeats and the leader's quorum check). Anything else is ticked in
        this turn's cycle."""
        if heard is Heard.APPEND:
            if group.raftCommitIndex > group.raftLastApplied:
                self._apply_later(group)
            return
        if not (group.raftbroker_live and group.can_commit()):
            if heard is not Heard.ACK_CAUGHT_UP:
                self._wake(group)
            return
        self._guarded_step(group, group.commit_now)
        if group.has_work:
            self._wake(group)

    def _schedule(self) -> None:
        if self._cycle_soon is None and self._loop is not None:
            self._cycle_soon = self._loop.call_soon(self._cycle)

    def _apply_later(self, group: _PatchedSyncObj) -> None:
        self._late.add(group)
        if self._late_timer is None and self._loop is not None:
            self._late_timer = self._loop.call_later(FOLLOWER_APPLY_DELAY_S, self._apply_late)

    def _apply_late(self) -> None:
        self._late_timer = None
        late, self._late = self._late, set()
        for group in late:
            self._due[group] = None
        self._cycle()

    def _commit_news(self, group: _PatchedSyncObj) -> None:
        self._news[group] = None
        if self._news_timer is None and self._loop is not None:
            self._news_timer = self._loop.call_later(COMMIT_NEWS_DELAY_S, self._tell_commits)

    def _tell_commits(self, *, final: bool = False) -> None:
        self._news_timer = None
        news, self._news = self._news, {}
        with self.mesh.held():  # every group's news to a peer in one write
            for group in news:
                if not group.raftbroker_live:
                    continue
                due = group.commit_news(COMMIT_NEWS_DELAY_S)
                if due or (due is None and final):
                    self._guarded_step(group, group.send_commit_index)
                elif due is None:
                    self._commit_news(group)  # appends are flowing: told when they stop

    def _on_timer(self) -> None:
        assert self._loop is not None
        self._timer = self._loop.call_later(self.tick_s, self._on_timer)
        self._due.update(dict.fromkeys(self._groups.values()))
        self.mesh.receive_waiting()  # heard before the election deadlines are checked
        self.mesh.tick(time.monotonic())  # dials, pings and timeouts: the timer's business
        self._cycle()

    def _cycle(self) -> None:
        self._cycle_soon = None
        due, self._due = self._due, {}
        with self.mesh.held():  # every group's heartbeats (and the pings) in one write per peer
            for group in due:
                if group.raftbroker_live:
                    self._tick(group)
                    if group.has_work:
                        self._due[group] = None
        if self._due:
            self._schedule()

    def _tick(self, group: _PatchedSyncObj) -> None:
        self._guarded_step(group, group.doTick)
        leading = bool(group._isLeader())
        if group.raftbroker_leading and not leading and group.raftbroker_on_deposed:
            group.raftbroker_on_deposed()
        group.raftbroker_leading = leading

    @staticmethod
    def _guarded_step(group: _PatchedSyncObj, step: Callable[[], None]) -> None:
        try:
            step()
        except Exception:
            # pysyncobj's own tick thread logs and carries on; we do the same but count it,
            # so a replica that fails on every tick shows up as unhealthy, not silent.
            group.raftbroker_tick_errors += 1
            _log_failure(group, f"group {group.raftbroker_group}: a tick failed")

    def _add(self, spec: GroupSpec, machine: ReplicatedMachine) -> _PatchedSyncObj:
        assert spec.name not in self._groups, f"group {spec.name} exists"
        assert spec.self_address == self.mesh.settings.self_address, "a group of another node"
        snapshots = _SnapshotFile(machine)
        conf = _sync_conf(
            spec,
            timing=self.timing,
            compaction_entries=self.compaction_entries,
            entries_bytes_max=self.entries_bytes_max,
            serializer=snapshots.serialize,
            deserializer=snapshots.deserialize,
        )
        try:
            group = _PatchedSyncObj(
                machine,
                spec,
                conf,
                self.mesh,
                wake=self._wake,
                heard=self._heard,
                commit_news=self._commit_news,
            )
        except BaseException:
            self.mesh.unregister(spec.route)  # pysyncobj may have readied its transport
            raise
        self._groups[spec.name] = group
        self._wake(group)
        return group

    async def add_group(
        self, spec: GroupSpec, machine: ReplicatedMachine, max_pending: int
    ) -> RaftGroup:
        assert self._loop is not None, "driver not started"
        return RaftGroup(spec, self._add(spec, machine), max_pending, self._loop)

    async def remove_group(self, name: str) -> None:
        group = self._groups.pop(name, None)
        if group is not None:
            self._due.pop(group, None)
            group.raftbroker_live = False
            group.destroy()


class _SnapshotFile:
    """pysyncobj's serializer hooks: `[format, machine bytes, last entry, prev entry, nodes]`."""

    def __init__(self, machine: ReplicatedMachine) -> None:
        self._machine = machine

    def serialize(self, path: str, raft_data: Any) -> None:
        last_entry, prev_entry, nodes = raft_data
        data = pack(
            [
                SNAPSHOT_FORMAT,
                self._machine.snapshot(),
                list(last_entry),
                list(prev_entry),
                sorted(n.address for n in nodes),
            ]
        )
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # the dump replaces journal entries: it must outlive a crash

    def deserialize(self, path: str) -> tuple[Any, ...]:
        with open(path, "rb") as f:
            data = f.read()
        try:
            raw = unpack(data, size_max=len(data))
        except CodecError as exc:
            raise CodecError(f"raft dump {path}: {exc}") from exc
        if not (isinstance(raw, tuple) and len(raw) == 5 and raw[0] == SNAPSHOT_FORMAT):
            raise CodecError(f"raft dump {path}: not a format-{SNAPSHOT_FORMAT} dump")
        _, machine, last_entry, prev_entry, addresses = raw
        self._machine.restore(machine)
        # pysyncobj compares these with its journal's tuples: they must be tuples, not lists.
        return tuple(last_entry), tuple(prev_entry), {TCPNode(a) for a in addresses}


class RaftGroup:
    """The event-loop side of one group: propose, and read its leadership and progress."""

    def __init__(
        self,
        spec: GroupSpec,
        sync: _PatchedSyncObj,
        max_pending: int,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.spec = spec
        self._sync = sync
        # The driver's loop, kept: asyncio.get_running_loop() is a getpid() syscall per call
        # in Python 3.11, and a write would make two.
        self._loop = loop
        self._max_pending = max_pending
        self._pending = 0
        self._stall_since: float | None = None
        self._last_applied_seen = 0
        self._follower_seen: dict[str, tuple[int, float]] = {}
        self._waiting: set[_Proposal] = set()
        sync.raftbroker_on_deposed = self._fail_waiting

    def _fail_waiting(self) -> None:
        """A deposed leader cannot tell whether its pending entries will commit: fail them
        retriably now (SEMANTICS.md, "Leadership") rather than when the client times out; a
        retry that meets a committed original is deduplicated."""
        error = ProposalError(ErrorCode.NOT_LEADER_OR_FOLLOWER, self.leader_address)
        for proposal in list(self._waiting):
            proposal.finish(None, error)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def is_leader(self) -> bool:
        return bool(self._sync._isLeader())

    @property
    def serving(self) -> bool:
        """Leader, and every entry of earlier terms is applied (the term-start barrier)."""
        noop = self._sync.noop_index
        return self.is_leader and noop is not None and self._sync.raftLastApplied >= noop

    @property
    def leader_address(self) -> str | None:
        leader = self._sync._getLeader()
        return None if leader is None else str(leader.address)

    async def propose(self, command: bytes, timeout_s: float, *, forward: bool = False) -> object:
        """Replicate and apply `command`; its apply result, or ProposalError (retriable).

        Without `forward` only a serving leader proposes (clients get NOT_LEADER and a hint);
        with it, a follower hands the command to the leader and resolves once it applied the
        entry itself, which the metadata group uses so any node can serve admin requests.
        """
        future: asyncio.Future[object] = self._loop.create_future()
        self.submit(command, timeout_s, partial(_resolve, future), forward=forward)
        return await future

    def submit(
        self, command: bytes, timeout_s: float, done: Done, *, forward: bool = False
    ) -> None:
        """`propose` for callers that want the outcome the moment it is known: `done(result,
        None)` or `done(None, error)` is called exactly once, from the apply (no task between
        the commit and the caller). ProposalError at once when it cannot be proposed here.
        """
        if not forward and not self.serving:
            raise ProposalError(ErrorCode.NOT_LEADER_OR_FOLLOWER, self.leader_address)
        if self._pending >= self._max_pending:
            raise ProposalError(ErrorCode.REQUEST_TIMED_OUT, None)
        proposal = _Proposal(self, done)
        proposal.timer = self._loop.call_later(timeout_s, proposal.expire)
        self._pending += 1
        if not forward:
            self._waiting.add(proposal)
        self._sync.propose_now(command, proposal.settle)

    def _finished(self, proposal: _Proposal) -> None:
        self._pending -= 1
        self._waiting.discard(proposal)

    async def read(self, fn: Callable[[], T]) -> T:
        """`fn`'s result: a view of the machine between applies (it runs on the same loop)."""
        return fn()

    def status(self) -> GroupStatus:
        sync = self._sync
        commit, applied = sync.raftCommitIndex, sync.raftLastApplied
        healthy, detail = self._health(commit, applied)
        return GroupStatus(
            self.name,
            self.is_leader,
            self.serving,
            self.leader_address,
            sync.raftCurrentTerm,
            commit,
            applied,
            healthy,
            detail,
        )

    def _health(self, commit: int, applied: int) -> tuple[bool, str]:
        now = time.monotonic()
        if applied < commit and applied == self._last_applied_seen:
            self._stall_since = self._stall_since or now
        else:
            self._stall_since = None
        self._last_applied_seen = applied
        if self._sync.raftbroker_tick_errors:
            return False, f"{self._sync.raftbroker_tick_errors} failed ticks"
        if self._stall_since is not None and now - self._stall_since > STALL_REPORT_S:
            return False, f"applied index stuck at {applied} below commit {commit}"
        lagging = self._lagging_followers(commit, now)
        if lagging:
            return False, f"followers not replicating: {', '.join(lagging)}"
        return True, ""

    def _lagging_followers(self, commit: int, now: float) -> list[str]:
        """Followers whose replicated index has trailed the commit index, unmoving, too long.

        A follower that stopped applying (or fails every tick) keeps acknowledging nothing; only
        the leader can see that, so the leader reports its group unhealthy.
        """
        lagging = []
        for address, match in self._sync.follower_match_indexes().items():
            seen_match, since = self._follower_seen.get(address, (match, now))
            if match >= commit or match != seen_match:
                since = now
            self._follower_seen[address] = (match, since)
            if now - since > STALL_REPORT_S:
                lagging.append(f"{address} at {match}")
        return lagging


Done = Callable[[object, "ProposalError | None"], None]


class _Proposal:
    """One proposal in flight: settled once, by pysyncobj's verdict, the timeout or a
    deposition, whichever comes first."""

    __slots__ = ("done", "finished", "group", "timer")

    def __init__(self, group: RaftGroup, done: Done) -> None:
        self.group = group
        self.done = done
        self.finished = False
        self.timer: asyncio.TimerHandle | None = None

    def settle(self, result: object, error: int) -> None:
        """pysyncobj's verdict."""
        if error == FAIL_REASON.SUCCESS:
            self.finish(result, None)
        elif error in _NOT_LEADER:
            self.finish(None, ProposalError(ErrorCode.NOT_LEADER_OR_FOLLOWER))
        else:
            self.finish(None, ProposalError(ErrorCode.REQUEST_TIMED_OUT))

    def expire(self) -> None:
        self.finish(None, ProposalError(ErrorCode.REQUEST_TIMED_OUT, self.group.leader_address))

    def finish(self, result: object, error: ProposalError | None) -> None:
        if self.finished:
            return  # timed out, or failed by a deposition, already
        self.finished = True
        if self.timer is not None:
            self.timer.cancel()
        self.group._finished(self)
        self.done(result, error)


def _resolve(future: asyncio.Future[object], result: object, error: ProposalError | None) -> None:
    if future.done():
        return  # its awaiter was cancelled
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)
