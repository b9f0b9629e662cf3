"""`PatchedSyncObj`: one replica of one group, a pysyncobj `SyncObj` ticked by the driver, talking
through the mesh, applying bytes to a `ReplicatedMachine`, the steady state of a write taken off
pysyncobj's general walks and its next-index rewind fixed; its configuration (`sync_conf`) and
its verdicts as our error codes (`APPLIED`, `failure`).
Part of the Raft adapter (cluster/raft/adapter/__init__.py has its rules).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf
from pysyncobj.monotonic import monotonic as pysyncobj_clock

from cluster.config import Timing
from cluster.raft.adapter.appends import take_append, take_reply
from cluster.raft.adapter.journal_bridge import JournalBridge
from cluster.raft.adapter.snapshots import damaged_dump
from cluster.raft.adapter.transport import (
    ENTRY_PREFIX,
    NO_OP_ENTRY,
    Heard,
    MeshNode,
    MeshTransport,
    Notifier,
    refusal_of,
)
from cluster.raft.journal import DUMP_NAME, JournalFile
from cluster.raft.mesh import Mesh
from cluster.raft.spec import GroupSpec, ReplicatedMachine
from statemachine.errors import ErrorCode

log = logging.getLogger(__name__)


# A new group's preferred leader stands this share of the minimum election timeout after start.
PREFERRED_FIRST_SHARE = 0.5


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
        # them, and `MeshTransport` binds no port per group (the mesh keeps every link).
        dynamicMembershipChange=False,
        useFork=False,
    )


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
        # On a leader: the last index of an entry a follower forwarded (`propose(forward=
        # True)`; noted by the transport as it answers the follower with the index): its
        # proposer waits for the follower to learn of the commit.
        self.raftbroker_forwarded_upto = 0
        self._append_period_s = conf.appendEntriesPeriod
        self._chunk_bytes = conf.appendEntriesBatchSizeBytes  # the stock walk chunks from here
        super().__init__(
            spec.self_address,
            list(spec.peer_addresses),
            conf,
            nodeClass=MeshNode,
            transportClass=MeshTransport,
        )
        # pysyncobj wakes its ticking thread with a pipe per group when a command is queued;
        # here the proposer is on the driver's own loop and marks the group due instead.
        stock: Any = vars(self)["_SyncObj__pipeNotifier"]
        os.close(stock._PipeNotifier__pipeR)
        os.close(stock._PipeNotifier__pipeW)
        self._SyncObj__pipeNotifier = Notifier(self._command_queued)
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
        journal = JournalBridge(file, self.raftbroker_log_bytes_max, self._log_full)
        if not len(journal):
            journal.add(NO_OP_ENTRY, 1, 0)
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
        follower before it acknowledges (`MeshTransport.send`)."""
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
        if entry[:2] == ENTRY_PREFIX:
            # The entry's term (the epoch of the leader that appended it) goes with it: stock
            # applies pass only the command, from the entry `__raftLastApplied` is one short of.
            log: Any = self._SyncObj__raftLog
            term: int = log[self._SyncObj__raftLastApplied + 1 - log[0][1]][2]
            return self.raftbroker_machine.apply(memoryview(entry)[2:], term)  # no batch copy
        assert entry == NO_OP_ENTRY, f"a log entry that is not ours: {entry[:16]!r}"
        return None

    def _command_queued(self) -> None:
        if not self.raftbroker_proposing:
            self.raftbroker_wake()

    def propose_now(self, command: bytes, callback: Callable[[object, int], None]) -> None:
        """Take a command at once, in this turn of the loop rather than the next tick's: a
        leader appends and sends it, a follower forwards it (through pysyncobj's queue)."""
        queued: Any = self._SyncObj__commandsQueue._FastQueue__queue
        if self._isLeader() and not queued:
            self._append_as_leader(ENTRY_PREFIX + command, callback)
        else:
            self.raftbroker_proposing = True
            try:
                self._applyCommand(ENTRY_PREFIX + command, callback)
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
    def awaits_forwarded(self) -> bool:
        """On a follower: a proposal it forwarded waits for an entry this commit reached and
        this replica has not applied yet (one a snapshot skipped waits for its timeout only,
        and keeps nothing from being batched)."""
        # (None while pysyncobj's constructor runs, when a peer's message may already come)
        waiting: dict[int, list[Any]] | None = getattr(
            self, "_SyncObj__commandsWaitingCommit", None
        )
        if not waiting or self._isLeader():
            return False
        applied, commit = self.raftLastApplied, self.raftCommitIndex
        return any(applied < index <= commit for index in waiting)

    @property
    def has_work(self) -> bool:
        """A tick would commit or apply something now."""
        return self.raftCommitIndex > self.raftLastApplied or self.can_commit()

    def _SyncObj__onMessageReceived(self, node: Any, message: dict[str, Any]) -> None:  # noqa: N802
        kind = message.get("type")
        refusal = refusal_of(message)
        if refusal is not None:
            self._refuse(node, refusal)
        elif kind == "append_entries" and "prevLogIdx" in message:
            take_append(self, node, message)  # not a snapshot's
        elif kind == "next_node_idx" and self._isLeader():
            take_reply(self, node, message)
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

    def _SyncObj__sendNextNodeIdx(  # noqa: N802
        self,
        node: Any,
        reset: bool = False,
        nextNodeIdx: int | None = None,  # noqa: N803 - stock's keyword, stock calls it so
        success: bool = False,
    ) -> None:
        """A follower's reply to an append, stamped with its term (`take_reply` drops one of
        another term than its leader's); stock sends the same fields without it."""
        next_index = self._SyncObj__getCurrentLogIndex() + 1 if nextNodeIdx is None else nextNodeIdx
        self._SyncObj__transport.send(
            node,
            {
                "type": "next_node_idx",
                "next_node_idx": next_index,
                "reset": reset,
                "success": success,
                "term": self._SyncObj__raftCurrentTerm,
            },
        )

    def _SyncObj__applyLogEntries(self) -> bool:  # noqa: N802
        # Unbatched, the stock leader sends every follower an append right after each apply,
        # only to tell it the new commit index: two sends in the same tick, before the
        # proposer hears its result. The driver sends that news a moment later instead, for
        # every apply of that moment at once (`RaftDriver._tell_commits`).
        # A forwarded proposal's commit is told at once: its proposer, on a follower, waits
        # for the news (a transaction's registrations and markers are such proposals).
        try:
            if SyncObj._SyncObj__applyLogEntries(self) and self._isLeader():
                if self.raftbroker_commit_sent < self.raftbroker_forwarded_upto:
                    self.send_commit_index()  # (until the commit passes the forwarded entry)
                else:
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
