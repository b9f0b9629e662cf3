"""pysyncobj, adapted: the only module of the repository that imports it.

Role: everything that subclasses pysyncobj or reaches into it. `PatchedSyncObj` is one
replica of one group: a `SyncObj` ticked by the driver (`autoTick=False`), talking through the
process's `Mesh` (`_MeshTransport`), applying `bytes` to a `ReplicatedMachine`, with the
steady state of a write taken off pysyncobj's general walks and its next-index rewind fixed.
`sync_conf` is its configuration, `SnapshotFile` its serializer hooks, `APPLIED`/`failure`
its verdicts as our error codes. The driver (driver.py) and the group (group.py) use only what
this module defines and pysyncobj's public properties (`raftCommitIndex`, `doTick`, ...).

Hardening of pysyncobj 0.3.17 (pinned in pyproject.toml; docs/design.md, "pysyncobj
overrides"):
- its leader sets a follower's next index to the index in each successful reply, so under
  pipelining an old reply rewinds it and the follower truncates entries it already applied;
  `PatchedSyncObj._on_reply` keeps the larger of the old and new index (the whole fix);
- peer traffic goes through our own transport, `cluster/raft/mesh.py` (one authenticated,
  encrypted connection per node pair for every group, msgpack frames), not pysyncobj's (a
  connection and port per group, bound to 0.0.0.0, every message pickled, zlib-compressed
  and Fernet-wrapped); large entries travel whole, never as pysyncobj's pickled chunks;
- a command goes into the log as it is, behind a two-byte prefix, and only such entries (and
  pysyncobj's own no-ops) are applied: nothing in a journal is ever unpickled;
- journal together with a full dump file, a regular compaction bound, a short leader
  fallback, batching off for latency;
- snapshots go through our own serializer: the machine's canonical bytes plus pysyncobj's two
  boundary entries, encoded with msgpack, never a pickle of the machine.

Rules: every name of pysyncobj's this module replaces, or touches beyond its documented API,
has a row in `OVERRIDES` below (what we do, why, and what stock pysyncobj does there);
tests/unit/test_pysyncobj_internals.py checks that each still exists in the installed
pysyncobj and that no private name is used here without a row. Upgrading pysyncobj means
reading every row against the new release.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from enum import Enum
from functools import partial
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf
from pysyncobj.journal import Journal
from pysyncobj.monotonic import monotonic as pysyncobj_clock
from pysyncobj.node import Node, TCPNode
from pysyncobj.syncobj import _COMMAND_TYPE, _RAFT_STATE
from pysyncobj.transport import Transport

from cluster.config import Timing
from cluster.files import sync_directory
from cluster.raft.journal import (
    DUMP_NAME,
    JournalError,
    JournalFile,
    Meta,
    open_dump,
    seal_dump,
)
from cluster.raft.mesh import Mesh
from cluster.raft.spec import GroupSpec, ReplicatedMachine
from statemachine.codec import CodecError, pack, unpack
from statemachine.errors import ErrorCode


class Override(NamedTuple):
    """A name of pysyncobj's that this module relies on: `owner` is its module or class."""

    owner: str
    name: str
    use: Literal["replaces", "writes", "reads", "calls"]
    why: str
    stock: str


_SYNC = "pysyncobj.syncobj.SyncObj"
_TRANSPORT = "pysyncobj.transport.Transport"
OVERRIDES: tuple[Override, ...] = (
    # -- SyncObj's methods, replaced ----------------------------------------------------------
    Override(
        _SYNC,
        "_SyncObj__doApplyCommand",
        "replaces",
        "applies our prefixed entries to the machine as they are; refuses any other entry "
        "but pysyncobj's no-op (an assert: nothing else is ever written)",
        "unpickles a regular entry into a method call (and version and membership entries)",
    ),
    Override(
        _SYNC,
        "_SyncObj__onMessageReceived",
        "replaces",
        "refuses a message that would put an entry not of ours in a log (`refusal_of`); "
        "a follower's append that extends its log and a leader's reply are taken directly; "
        "a reply keeps the larger next index (the rewind fix); the rest goes to stock",
        "walks every message type for each message; a reply assigns the next index; joins "
        "chunked entries and appends any entry, which its apply unpickles",
    ),
    Override(
        _SYNC,
        "_SyncObj__applyLogEntries",
        "replaces",
        "wraps stock: the news of new commits goes to the driver, sent a moment later for "
        "all of them at once; the machine settles after every run of applies",
        "returns 'send appends now' after each apply, only to carry the commit index",
    ),
    Override(
        _SYNC,
        "_SyncObj__sendAppendEntries",
        "replaces",
        "wraps stock: notes the commit index the appends carry (`commit_news`)",
        "the general walk over every follower, from its next index",
    ),
    Override(
        _SYNC,
        "_SyncObj__pipeNotifier",
        "replaces",
        "a `_Notifier` that marks the group due on the driver's loop; the pipe is closed",
        "a PipeNotifier whose pipe wakes the tick thread's poll when a command is queued",
    ),
    Override(
        _SYNC,
        "_poller",
        "replaces",
        "a `_GroupPolls` that absorbs the calls: the mesh's sockets are watched on the loop",
        "a select/poll poller each tick ends by polling",
    ),
    # -- SyncObj's state, read and written by the steady-state paths -----------------------------
    Override(
        _SYNC,
        "_SyncObj__raftLog",
        "writes",
        "replaced after construction by `_Journal` (our checksummed files, cluster/raft/"
        "journal.py); a leader appends a proposal and a follower an append's entries directly",
        "a `FileJournal` from `createJournal`, appended by `_checkCommandsToApply` and the "
        "general append handler",
    ),
    Override(
        _SYNC,
        "_SyncObj__votedForNodeId",
        "writes",
        "restored from `_Journal` once it replaces the journal",
        "restored in `__init__` from the journal `createJournal` made",
    ),
    Override(
        _SYNC,
        "_SyncObj__commandsQueue",
        "reads",
        "a proposal skips the queue when nothing waits in it",
        "every command goes through it to the next tick",
    ),
    Override(
        _SYNC,
        "_SyncObj__commandsWaitingCommit",
        "writes",
        "a leader's proposal registers its callback by index, as `_checkCommandsToApply` does",
        "filled by `_checkCommandsToApply`",
    ),
    Override(
        _SYNC,
        "_SyncObj__raftCurrentTerm",
        "writes",
        "the term of a new entry, of an append, of the entries a leader may commit; restored "
        "from `_Journal` once it replaces the journal, as stock `__init__` restores it",
        "the same; restored in `__init__` from the journal `createJournal` made",
    ),
    Override(
        _SYNC,
        "_SyncObj__raftCommitIndex",
        "writes",
        "a leader commits on an acknowledgement, a follower on an append; restored from "
        "`_Journal` once it replaces the journal",
        "advanced in a tick and in the general append handler; restored in `__init__`",
    ),
    Override(
        _SYNC,
        "_SyncObj__leaderCommitIndex",
        "writes",
        "set where stock sets it, on the paths taken directly",
        "set by a tick (leader) and the append handler (follower)",
    ),
    Override(
        _SYNC,
        "_SyncObj__raftNextIndex",
        "writes",
        "advanced when a new entry goes out alone; a reply never lowers it (the fix)",
        "set from every successful reply, so an old reply rewinds it",
    ),
    Override(
        _SYNC,
        "_SyncObj__raftMatchIndex",
        "writes",
        "raised by a reply; read to commit on an acknowledgement and to report lag",
        "the same, in the general handler and a tick",
    ),
    Override(
        _SYNC,
        "_SyncObj__lastResponseTime",
        "writes",
        "a reply taken directly counts for the leader's quorum check, as in stock",
        "set by the general reply handler",
    ),
    Override(
        _SYNC,
        "_SyncObj__newAppendEntriesTime",
        "writes",
        "a new entry sent alone postpones the heartbeat, as the walk does; read by "
        "`commit_news` to see when appends last went out",
        "set by `__sendAppendEntries`",
    ),
    Override(
        _SYNC,
        "_SyncObj__raftElectionDeadline",
        "writes",
        "a follower's append taken directly postpones the election, as in stock; a new "
        "group's first deadline favours its preferred leader (`_first_election`)",
        "set by the general append handler",
    ),
    Override(
        _SYNC,
        "_SyncObj__otherNodes",
        "reads",
        "the followers a new entry goes to",
        "the same",
    ),
    Override(
        _SYNC,
        "_SyncObj__connectedNodes",
        "reads",
        "a new entry goes out alone only while every follower is connected; a follower not "
        "connected is not in sync (`connected_followers`)",
        "the walk skips a follower that is not",
    ),
    Override(
        _SYNC,
        "_SyncObj__readonlyNodes",
        "reads",
        "none here; any would send the walk's way",
        "the walk sends to them too",
    ),
    Override(
        _SYNC,
        "_SyncObj__transport",
        "reads",
        "our `_MeshTransport`, to send an entry or a reply directly",
        "the same object",
    ),
    Override(
        _SYNC,
        "_SyncObj__raftState",
        "reads",
        "only a follower takes an append directly",
        "the same",
    ),
    Override(
        _SYNC,
        "_SyncObj__raftLeader",
        "reads",
        "only its leader's append is taken directly",
        "the general handler changes leaders",
    ),
    Override(
        _SYNC,
        "_SyncObj__transferInProgress",
        "reads",
        "during a leadership transfer appends go to stock",
        "ignores the outgoing leader's heartbeats while it is set",
    ),
    Override(
        _SYNC,
        "_SyncObj__noopIDx",
        "reads",
        "a leader serves once the no-op of its term is applied (the term-start barrier)",
        "set when it becomes leader",
    ),
    Override(
        _SYNC,
        "_SyncObj__generateRaftTimeout",
        "calls",
        "a follower's next election deadline, as stock draws it (and, lengthened, the first "
        "one of a new group's replica that is not its preferred leader)",
        "the same",
    ),
    Override(
        _SYNC,
        "_SyncObj__getCurrentLogIndex",
        "calls",
        "the log's last index",
        "the same",
    ),
    Override(
        _SYNC,
        "_isLeader",
        "calls",
        "aliased as `is_leader`: leadership, read on every proposal and tick",
        "the same",
    ),
    Override(
        _SYNC,
        "_getLeader",
        "calls",
        "aliased as `leader`: the leader hint of a refusal",
        "the same",
    ),
    Override(
        _SYNC,
        "_applyCommand",
        "calls",
        "a proposal that does not go out directly (no leader yet, or a follower forwarding)",
        "queues it for the next tick",
    ),
    Override(
        _SYNC,
        "_checkCommandsToApply",
        "calls",
        "takes that command in this turn of the loop, not the next tick's",
        "called by every tick",
    ),
    # -- the other classes -------------------------------------------------------------------
    Override(
        "pysyncobj.fast_queue.FastQueue",
        "_FastQueue__queue",
        "reads",
        "whether commands wait, without a get that raises queue.Empty",
        "a deque behind a lock",
    ),
    *(
        Override(
            "pysyncobj.journal.Journal",
            name,
            "replaces",
            "`_Journal` implements the journal's interface over our own files (a CRC-32C per "
            "record, recovery to the last whole one, compaction by rename, meta with a CRC)",
            "abstract; `FileJournal` implements it (an mmap, no checksum, compaction rewrites "
            "the file in place, a pickled meta file replaced without fsync)",
        )
        for name in (
            "add",
            "clear",
            "deleteEntriesFrom",
            "deleteEntriesTo",
            "__getitem__",
            "__len__",
            "_destroy",
            "setRaftCommitIndex",
            "getRaftCommitIndex",
            "setCurrentTerm",
            "getCurrentTerm",
            "getVotedForNodeId",
            "onOneSecondTimer",
        )
    ),
    Override(
        "pysyncobj.pipe_notifier.PipeNotifier",
        "_PipeNotifier__pipeR",
        "writes",
        "closed: the notifier is replaced",
        "the pipe's read end, polled by the tick thread",
    ),
    Override(
        "pysyncobj.pipe_notifier.PipeNotifier",
        "_PipeNotifier__pipeW",
        "writes",
        "closed: the notifier is replaced",
        "the pipe's write end",
    ),
    Override(
        _TRANSPORT,
        "_onMessageReceived",
        "calls",
        "hands a peer's message to the group",
        "how a transport does it",
    ),
    Override(
        _TRANSPORT,
        "_onNodeConnected",
        "calls",
        "a peer's link opened",
        "how a transport does it",
    ),
    Override(
        _TRANSPORT,
        "_onNodeDisconnected",
        "calls",
        "a peer's link closed",
        "how a transport does it",
    ),
    Override(
        _TRANSPORT,
        "tryGetReady",
        "replaces",
        "registers the group with the mesh (nothing to bind)",
        "TCPTransport binds a port per group",
    ),
    Override(_TRANSPORT, "ready", "replaces", "once registered", "once bound"),
    Override(
        _TRANSPORT,
        "send",
        "replaces",
        "one msgpack frame on the peer's mesh link",
        "TCPTransport pickles, compresses and encrypts it on a connection per group",
    ),
    Override(
        _TRANSPORT,
        "destroy",
        "replaces",
        "unregisters the group from the mesh",
        "TCPTransport closes its server and connections",
    ),
    Override(
        "pysyncobj.node.Node",
        "_id",
        "reads",
        "`_Node.__eq__` compares ids without the `id` property",
        "the node's id (its address)",
    ),
    Override(
        "pysyncobj.node.Node",
        "__hash__",
        "replaces",
        "the hash is computed once",
        "hashes the `id` property on every call, some thirty times a write",
    ),
    Override(
        "pysyncobj.node.Node",
        "__eq__",
        "replaces",
        "identity first, then the ids",
        "compares the `id` properties of both sides",
    ),
    Override("pysyncobj.node.Node", "__ne__", "replaces", "as `__eq__`", "as its `__eq__`"),
    # -- module-level names ------------------------------------------------------------------
    Override(
        "pysyncobj.syncobj",
        "_COMMAND_TYPE",
        "reads",
        "REGULAR starts our entry prefix; NO_OP is the only other entry applied",
        "the type byte of every log entry",
    ),
    Override(
        "pysyncobj.syncobj",
        "_RAFT_STATE",
        "reads",
        "FOLLOWER: only a follower takes an append directly",
        "the replica's role",
    ),
)

log = logging.getLogger(__name__)

SNAPSHOT_FORMAT = 2  # 2: sealed with a CRC-32C; 1 (unsealed) is still read
# A new group's preferred leader stands this share of the minimum election timeout after start.
PREFERRED_FIRST_SHARE = 0.5
# A log entry of ours: pysyncobj's type byte for a regular command, then a mark of our own.
_ENTRY_PREFIX = bytes([_COMMAND_TYPE.REGULAR]) + b"R"
_NO_OP_ENTRY = bytes([_COMMAND_TYPE.NO_OP])  # a leader's first entry of its term
# pysyncobj's verdict on a proposal: applied, or the error its proposer gets (`failure`).
APPLIED = FAIL_REASON.SUCCESS
_NOT_LEADER = frozenset(
    {
        FAIL_REASON.MISSING_LEADER,
        FAIL_REASON.DISCARDED,
        FAIL_REASON.NOT_LEADER,
        FAIL_REASON.LEADER_CHANGED,
    }
)


def failure(reason: int) -> ErrorCode:
    """The retriable code a proposer gets for pysyncobj's verdict `reason` (not APPLIED)."""
    if reason in _NOT_LEADER:
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    return ErrorCode.REQUEST_TIMED_OUT


def sync_conf(
    spec: GroupSpec,
    *,
    timing: Timing,
    compaction_entries: int,
    entries_bytes_max: int,
    serializer: Callable[[str, Any], None],
    deserializer: Callable[[str], Any],
) -> SyncObjConf:
    """pysyncobj's configuration of a replica of `spec`: ticked by the driver, journaled."""
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
        journalFile=None,  # a memory journal, which `PatchedSyncObj` replaces by ours
        fullDumpFile=str(spec.directory / DUMP_NAME),
        serializer=serializer,
        deserializer=deserializer,
        logCompactionMinEntries=compaction_entries,
        logCompactionMinTime=60,
        commandsQueueSize=0,  # we bound the queue ourselves, per group, in RaftGroup
        # No bind retries or connection timeouts: only pysyncobj's own TCP transport reads
        # them, and `_MeshTransport` binds no port per group (the mesh keeps every link).
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
        self._durable: bool = sync_obj.raftbroker_durable

    @property
    def ready(self) -> bool:
        return self._registered

    def tryGetReady(self) -> None:  # noqa: N802
        if not self._registered:
            self._registered = True
            self._mesh.register(self._group, self)

    def send(self, node: Any, message: dict[str, Any]) -> bool:
        if self._durable and message.get("type") == "next_node_idx":
            # A follower's acknowledgement says it holds the entries: on disk, when durable
            # (one sync for everything this event appended or cut, however many entries).
            self._sync_obj.sync_journal()
        return self._mesh.send(node.address, self._group, message)

    def send_to_each(self, nodes: Iterable[Any], message: dict[str, Any]) -> None:
        """The same message to each of `nodes`, packed once (a leader's new entry)."""
        assert message.get("type") != "next_node_idx", "an acknowledgement goes to one node"
        payload = self._mesh.payload(self._group, message)
        for node in nodes:
            self._mesh.send_payload(node.address, payload)

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
        except Exception:  # noqa: BLE001 - logged by log_failure, counted as a failed tick
            # A peer holds the secret, so this is a bug or a broken replica, not an attack; it
            # must not take the driver (and every other group) down with it, and it
            # must show: it counts as a failed tick, which makes the group report unhealthy.
            sync.raftbroker_tick_errors += 1
            log_failure(sync, f"group {self._group}: a message from {address} failed")
        else:
            if kind == "next_node_idx" and sync.holds_every_entry(node):
                heard = Heard.ACK_CAUGHT_UP
        sync.raftbroker_heard(heard)


def refusal_of(message: dict[str, Any]) -> str | None:
    """Why a peer's message must not reach pysyncobj, or None when it may.

    Only entries of ours (`_ENTRY_PREFIX`) and pysyncobj's no-op may enter a log: stock
    pysyncobj would unpickle any other entry when it applies it (and our apply asserts on one,
    stopping the replica). So an append whose entries are anything else is refused, and so is a
    forwarded command without our prefix, and a chunked entry (`transmission`: pysyncobj
    unpickles the chunks it joins; our leaders never send one).
    """
    kind = message.get("type")
    if kind == "append_entries":
        if "transmission" in message:
            return "a chunked entry (pysyncobj would unpickle it; we never send one)"
        entries = message.get("entries", ())
        if not isinstance(entries, (list, tuple)):
            return "entries that are not a list"
        for entry in entries:
            if not _is_our_entry(entry):
                return f"an entry that is not ours: {_sample(entry)}"
    elif kind == "apply_command":
        command = message.get("command")
        if not (isinstance(command, bytes) and command.startswith(_ENTRY_PREFIX)):
            return f"a forwarded command that is not ours: {_sample(command)}"
    return None


def _is_our_entry(entry: object) -> bool:
    """`(command, index, term)` whose command is ours or pysyncobj's no-op."""
    if not (isinstance(entry, (list, tuple)) and len(entry) == 3):
        return False
    command, index, term = entry
    return (
        isinstance(command, bytes)
        and (command.startswith(_ENTRY_PREFIX) or command == _NO_OP_ENTRY)
        and type(index) is int
        and type(term) is int
    )


def _sample(value: object) -> str:
    """A short, safe rendering of what a peer sent, for a log line."""
    return repr(value)[:48]


def log_failure(sync_obj: Any, what: str) -> None:
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
    """pysyncobj's pipe notifier, replaced: `notify` marks the group due on the driver's loop."""

    def __init__(self, notify: Callable[[], None]) -> None:
        self.notify = notify


class _Journal(Journal):  # type: ignore[misc]
    """pysyncobj's journal interface over our files (cluster/raft/journal.py): a CRC-32C on
    every record and on the meta, recovery to the last whole record, compaction that writes a
    new file and renames it over the old one, and with `durable` an fsync per `sync` (the
    group syncs once per event before anything reports what it appended) and per change of
    term or vote (before the vote or the term is used, as Raft requires).

    The commit index is stored lazily, on pysyncobj's one-second timer, as stock does: a
    replica that comes back with an older one only applies again what it had applied.

    Past `bytes_max` in its file (and in memory: pysyncobj keeps the log as a list), an append
    asks for a compaction (`on_full`), as pysyncobj's own bound asks by entry count and time
    only."""

    def __init__(self, file: JournalFile, bytes_max: int, on_full: Callable[[], None]) -> None:
        self.file = file
        self._commit_index = file.meta.commit_index
        self._bytes_max = bytes_max
        self._on_full = on_full

    def add(self, command: bytes, idx: int, term: int) -> None:
        self.file.append(command, idx, term)
        if self.file.end > self._bytes_max:
            self._on_full()

    def clear(self) -> None:
        self.file.rewrite(())

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802, N803
        self.file.truncate_from(entryFrom)

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802, N803
        self.file.rewrite(self.file.entries[entryTo:])

    def __getitem__(self, item: Any) -> Any:
        return self.file.entries[item]

    def __len__(self) -> int:
        return len(self.file.entries)

    def _destroy(self) -> None:
        self._store_commit_index()
        self.file.close()

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:  # noqa: N802, N803
        self._commit_index = raftCommitIndex

    def getRaftCommitIndex(self) -> int:  # noqa: N802
        return self.file.meta.commit_index

    def setCurrentTerm(self, term: int, votedForNodeId: str | None) -> None:  # noqa: N802, N803
        self.file.store_meta(Meta(term, votedForNodeId, self._commit_index))

    def getCurrentTerm(self) -> int:  # noqa: N802
        return self.file.meta.term

    def getVotedForNodeId(self) -> str | None:  # noqa: N802
        return self.file.meta.voted_for

    def onOneSecondTimer(self) -> None:  # noqa: N802
        self._store_commit_index()

    def _store_commit_index(self) -> None:
        if self._commit_index != self.file.meta.commit_index and not self.file.closed:
            self.file.store_meta(self.file.meta._replace(commit_index=self._commit_index))


class PatchedSyncObj(SyncObj):  # type: ignore[misc]
    """A SyncObj applying bytes to one machine, with the next-index rewind fixed."""

    def __init__(
        self,
        machine: ReplicatedMachine,
        spec: GroupSpec,
        conf: SyncObjConf,
        mesh: Mesh,
        *,
        wake: Callable[[PatchedSyncObj], None],
        heard: Callable[[PatchedSyncObj, Heard], None],
        commit_news: Callable[[PatchedSyncObj], None],
        durable: bool = False,
        sync_soon: Callable[[PatchedSyncObj], None] = lambda _group: None,
        log_bytes_max: int,
    ) -> None:
        self.raftbroker_machine = machine
        self.raftbroker_log_bytes_max = log_bytes_max
        self.raftbroker_mesh = mesh
        self.raftbroker_durable = durable
        self.raftbroker_sync_soon = partial(sync_soon, self)
        self.raftbroker_group = spec.route
        self.raftbroker_tick_errors = 0
        self.raftbroker_refused_messages = 0
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
        self._use_journal(self._journal_file(spec.directory, durable))
        self._first_election(spec, conf)
        self.raftbroker_live = True

    def _journal_file(self, directory: Path, durable: bool) -> JournalFile:
        """The group's journal; with a dump that cannot be loaded (cut, damaged), none: the dump
        is moved aside and the log emptied (term and vote kept), so the replica starts as a new
        follower and its leader sends it a snapshot. Loading it anyway would start the machine
        from a wrong state, or from none under a log that begins past the dump."""
        file = JournalFile(directory, durable=durable)
        reason = damaged_dump(directory)
        if reason is not None:
            aside = directory / (DUMP_NAME + ".damaged")
            os.replace(directory / DUMP_NAME, aside)
            file.rewrite(())
            log.error(
                "group %s: its dump is refused (%s) and moved to %s; the log is emptied, "
                "the leader sends the group's state again",
                self.raftbroker_group,
                reason,
                aside.name,
            )
        return file

    def _use_journal(self, file: JournalFile) -> None:
        """Our journal in place of the one pysyncobj made in memory (`journalFile` is None in
        its configuration), and what stock `__init__` restores from a journal restored from
        ours: the first no-op of an empty log, the term (at least the last entry's), the vote,
        the commit index. Nothing has ticked yet, so nothing saw the memory journal."""
        if file.dropped_bytes:
            log.warning(
                "group %s: the journal's last %d bytes were torn or damaged and are cut off; "
                "the leader sends those entries again",
                self.raftbroker_group,
                file.dropped_bytes,
            )
        journal = _Journal(file, self.raftbroker_log_bytes_max, self._log_full)
        if not len(journal):
            journal.add(_NO_OP_ENTRY, 1, 0)
        self.raftbroker_journal = journal
        self._SyncObj__raftLog = journal
        self._SyncObj__raftCurrentTerm = max(journal.getCurrentTerm(), journal[-1][2])
        self._SyncObj__votedForNodeId = journal.getVotedForNodeId()
        # Never past the log: a torn tail or a refused dump may have cut it below the commit
        # index last stored (pysyncobj clamps so after loading a dump; here there may be none).
        self._SyncObj__raftCommitIndex = min(journal.getRaftCommitIndex(), journal[-1][1])

    def _log_full(self) -> None:
        """Compact at the next tick, which comes in this turn of the loop: the timer's ticks
        are a heartbeat apart, time enough for a loaded leader to append a hundred batches."""
        self.forceLogCompaction()
        self.raftbroker_wake()

    def journal_bytes(self) -> int:
        """The size of the log not yet compacted (as it is in memory, with record heads). A
        method: pysyncobj's constructor reads every attribute, before the journal exists."""
        return int(self.raftbroker_journal.file.end)

    def sync_journal(self) -> None:
        """Make what this replica appended to its journal durable (with `durable`; at once
        otherwise). The leader syncs before it counts itself among an entry's holders, a
        follower before it acknowledges (`_MeshTransport.send`)."""
        self.raftbroker_journal.file.sync()

    def _first_election(self, spec: GroupSpec, conf: SyncObjConf) -> None:
        """In a new group, its preferred leader stands first: left to chance (every replica
        drawing a timeout as stock does), a new topic's leaders all too often land on one
        node (the one that started its groups first, often the metadata leader). The
        preferred replica stands `PREFERRED_FIRST_SHARE` of the minimum timeout after it
        starts; the others wait one maximum timeout longer than stock, so the preferred one
        gets a second try (should its first request reach a peer that has not started the
        group yet) before any other stands. A replica that has seen an election (term > 0:
        a restart) keeps stock timing, so failover and restarts are as fast as before; and
        once any leader is heard, every deadline is stock's again."""
        preferred = spec.preferred_leader
        if preferred is None or self.raftCurrentTerm != 0:
            return
        if preferred == spec.self_address:
            wait_s = conf.raftMinTimeout * PREFERRED_FIRST_SHARE
        else:
            wait_s = self._SyncObj__generateRaftTimeout() + conf.raftMaxTimeout
        self._SyncObj__raftElectionDeadline = pysyncobj_clock() + wait_s

    # Leadership and the leader, as pysyncobj tells them: aliases, not wrappers, since a
    # proposal and a tick each read them (a call more would cost on every write).
    is_leader = SyncObj._isLeader
    leader = SyncObj._getLeader

    def _SyncObj__doApplyCommand(self, entry: bytes) -> object:  # noqa: N802
        # An entry is pysyncobj's type byte, our mark and the command as it is: no pickle of a
        # method call to build on the leader and take apart on every replica. Every regular
        # entry is written so (`propose_now`) and membership and version entries are off, so
        # the only other entry is pysyncobj's no-op. Anything else is a broken invariant (a
        # bug, a corrupt journal) and is never unpickled: the assert fails the apply, which
        # stops this replica at that entry, and the driver logs it and counts a failed tick,
        # so the group reports unhealthy. Skipping it would leave the machine past a command
        # it never applied and its proposer without an answer.
        if entry[:2] == _ENTRY_PREFIX:
            return self.raftbroker_machine.apply(memoryview(entry)[2:])  # no copy of a batch
        assert entry == _NO_OP_ENTRY, f"a log entry that is not ours: {entry[:16]!r}"
        return None

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
        if self.raftbroker_durable:
            # Synced at the end of this turn of the loop (one sync for every entry it
            # appended), while the followers sync theirs: by the time their acknowledgements
            # arrive the leader holds the entry on disk too, and commits without waiting.
            self.raftbroker_sync_soon()
        self._SyncObj__commandsWaitingCommit[index].append((term, callback))
        if not sent:
            self._SyncObj__sendAppendEntries()

    def _send_new_entry(
        self, log: Any, entry: tuple[bytes, int, int], previous: tuple[bytes, int, int]
    ) -> bool:
        """On a leader whose followers all hold everything up to `previous`, its last entry:
        send each the new `entry` alone (one message, packed once for all of them), as
        pysyncobj's `__sendAppendEntries` would, without its general walk (slices of the
        journal per follower, chunking, snapshots). False, and nothing sent, in any other case
        (a follower behind or away, an entry the stock walk would send in chunks, the log's
        first entry), which the stock walk then handles."""
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
        for node in others:
            next_indexes[node] = index + 1
        self._SyncObj__transport.send_to_each(others, message)
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
        if self.raftbroker_durable:  # the leader counts itself a holder of what is on disk
            self.sync_journal()
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
        refusal = refusal_of(message)
        if refusal is not None:
            self._refuse(node, refusal)
        elif kind == "append_entries" and self._extends_log(node, message):
            self._on_append(node, message)
        elif kind == "next_node_idx" and self._isLeader():
            self._on_reply(node, message)
        else:
            SyncObj._SyncObj__onMessageReceived(self, node, message)

    def _refuse(self, node: Any, refusal: str) -> None:
        """Drop a peer's message that would put a foreign entry in the log: logged at WARNING
        (the 1st, 10th, 100th, ... of the group) and counted, so the group reports unhealthy.
        Its sender holds the cluster secret, so this is a broken or hostile node."""
        self.raftbroker_refused_messages += 1
        count = self.raftbroker_refused_messages
        if count in (1, 10, 100, 1_000, 10_000):
            log.warning(
                "group %s: refused a message from %s: %s (%d refused so far)",
                self.raftbroker_group,
                node.address,
                refusal,
                count,
            )

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
        follower is then sent entries it already holds and truncates (docs/design.md,
        "pysyncobj overrides"). The larger index is kept."""
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

    def connected_followers(self) -> frozenset[str]:
        """The Raft addresses of the peers whose link is open now."""
        connected: set[Any] = self._SyncObj__connectedNodes
        return frozenset(str(node.address) for node in list(connected))

    @property
    def log_index(self) -> int:
        index: int = self._SyncObj__getCurrentLogIndex()
        return index

    @property
    def noop_index(self) -> int | None:
        index: int | None = self._SyncObj__noopIDx
        return index


class SnapshotFile:
    """pysyncobj's serializer hooks: the dump, `[format, machine bytes, last entry, prev
    entry, nodes]` in msgpack, sealed with a CRC-32C (journal.py: `seal_dump`)."""

    def __init__(self, machine: ReplicatedMachine, *, durable: bool = False) -> None:
        self._machine = machine
        self._durable = durable

    def serialize(self, path: str, raft_data: Any) -> None:
        last_entry, prev_entry, nodes = raft_data
        payload = pack(
            [
                SNAPSHOT_FORMAT,
                self._machine.snapshot(),
                list(last_entry),
                list(prev_entry),
                sorted(n.address for n in nodes),
            ]
        )
        with open(path, "wb") as f:
            f.write(seal_dump(payload))
            f.flush()
            os.fsync(f.fileno())  # the dump replaces journal entries: it must outlive a crash

    def deserialize(self, path: str) -> tuple[Any, ...]:
        with open(path, "rb") as f:
            data = f.read()
            if self._durable:  # a dump installed from the leader, acknowledged after this
                os.fsync(f.fileno())
                sync_directory(Path(path).parent)
        machine, last_entry, prev_entry, addresses = parse_dump(data, path)
        self._machine.restore(machine)
        # pysyncobj compares these with its journal's tuples: they must be tuples, not lists.
        return tuple(last_entry), tuple(prev_entry), {TCPNode(a) for a in addresses}


def parse_dump(data: bytes, path: str) -> tuple[bytes, Any, Any, Any]:
    """A dump's machine snapshot, last and previous entries and node addresses; CodecError
    (or JournalError) naming `path` for anything else."""
    payload = open_dump(data, Path(path))
    if payload is None:
        raise CodecError(f"raft dump {path}: not sealed (a dump of format {SNAPSHOT_FORMAT} is)")
    try:
        raw = unpack(payload, size_max=len(data))
    except CodecError as exc:
        raise CodecError(f"raft dump {path}: {exc}") from exc
    if not (isinstance(raw, tuple) and len(raw) == 5 and raw[0] == SNAPSHOT_FORMAT):
        raise CodecError(f"raft dump {path}: not a format-{SNAPSHOT_FORMAT} dump")
    _, machine, last_entry, prev_entry, addresses = raw
    return machine, last_entry, prev_entry, addresses


def damaged_dump(directory: Path) -> str | None:
    """Why the group's dump cannot be loaded, or None (no dump, or a sound one)."""
    path = directory / DUMP_NAME
    try:
        parse_dump(path.read_bytes(), str(path))
    except FileNotFoundError:
        return None
    except (CodecError, JournalError) as exc:
        return str(exc)
    return None
