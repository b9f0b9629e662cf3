"""pysyncobj's internals the adapter replaces or reaches into: one row each (`OVERRIDES`),
what we do and why, and what stock pysyncobj does there; tests/unit/test_pysyncobj_internals.py
holds every row to the installed release and every private name the adapter uses to a row.
Part of the Raft adapter (cluster/raft/adapter/__init__.py has its rules).
"""

from __future__ import annotations

from typing import Literal, NamedTuple


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
        "a follower's append and a leader's reply are taken by appends.py, by the Raft "
        "paper's rules (entries an append repeats are kept, the log is cut only at a "
        "conflict, the commit goes up to the append's last entry; a reply keeps the larger "
        "next index and one of another term is dropped); the rest goes to stock",
        "walks every message type for each message; a reply assigns the next index; an "
        "append deletes every entry after its previous one and commits up to the log's end; "
        "joins chunked entries and appends any entry, which its apply unpickles",
    ),
    Override(
        _SYNC,
        "_SyncObj__applyLogEntries",
        "replaces",
        "wraps stock: the news of new commits goes to the driver, sent a moment later for "
        "all of them at once, or at once until the commit passes the last entry a follower "
        "forwarded (the transport notes its index); the machine settles after every run of "
        "applies",
        "returns 'send appends now' after each apply, only to carry the commit index",
    ),
    Override(
        _SYNC,
        "_SyncObj__sendNextNodeIdx",
        "replaces",
        "stamps a follower's reply with its term: the leader drops a reply of another term "
        "(one delivered late after a cut link healed would set a match index the follower's "
        "log no longer backs, and commit entries a majority does not hold)",
        "sends the next index, reset and success flags, no term",
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
        "a `Notifier` that marks the group due on the driver's loop; the pipe is closed",
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
        "replaced after construction by `JournalBridge` (our checksummed files, cluster/raft/"
        "journal.py); a leader appends a proposal and a follower an append's entries directly",
        "a `FileJournal` from `createJournal`, appended by `_checkCommandsToApply` and the "
        "general append handler",
    ),
    Override(
        _SYNC,
        "_SyncObj__votedForNodeId",
        "writes",
        "restored from `JournalBridge` once it replaces the journal",
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
        "a leader's proposal registers its callback by index, as `_checkCommandsToApply` does; "
        "a follower applies at once a commit that reaches a forwarded proposal waiting in it",
        "filled by `_checkCommandsToApply`, and by a follower's `apply_command_response`",
    ),
    Override(
        _SYNC,
        "_SyncObj__raftCurrentTerm",
        "writes",
        "the term of a new entry, of an append, of the entries a leader may commit; restored "
        "from `JournalBridge` once it replaces the journal, as stock `__init__` restores it",
        "the same; restored in `__init__` from the journal `createJournal` made",
    ),
    Override(
        _SYNC,
        "_SyncObj__raftCommitIndex",
        "writes",
        "a leader commits on an acknowledgement, a follower on an append; restored from "
        "`JournalBridge` once it replaces the journal",
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
        "_SyncObj__raftLastApplied",
        "reads",
        "the index of the entry being applied (one past it), whose term goes to the machine",
        "applies pass the command alone",
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
        "our `MeshTransport`, to send an entry or a reply directly",
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
            "`JournalBridge` implements the journal's interface over our own files (a CRC-32C per "
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
        "`MeshNode.__eq__` compares ids without the `id` property",
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
