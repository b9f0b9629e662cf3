"""Raft's append exchange, taken off pysyncobj: a follower taking its leader's append
(`take_append`) and a leader taking the follower's reply (`take_reply`), by the rules of the
Raft paper's AppendEntries, where stock pysyncobj breaks two of them (docs/design.md, "pysyncobj
overrides"). `PatchedSyncObj` routes both messages here; the rest of pysyncobj's walk stays
stock. Part of the Raft adapter (cluster/raft/adapter/__init__.py has its rules).
"""

from __future__ import annotations

import logging
from typing import Any

from pysyncobj import SyncObj
from pysyncobj.monotonic import monotonic as pysyncobj_clock
from pysyncobj.syncobj import _RAFT_STATE

log = logging.getLogger(__name__)

# The line pysyncobj logs when it drops applied entries; chaos runs count it
# (cluster/chaos/runner.py), so ours keeps its words.
APPLIED_TRUNCATION = (
    "truncating already-applied log entries from index %d (last applied: %d) - state machine "
    "may have diverged from other cluster members"
)


def take_append(sync: Any, node: Any, message: dict[str, Any]) -> None:
    """A follower's side of an append (`prevLogIdx`, `prevLogTerm`, `entries`,
    `commit_index`), by the paper's rules 1-5. Stock pysyncobj departs from two of them: it
    deletes every entry after `prevLogIdx` whenever it holds any, even entries the append
    repeats (rule 3 deletes only from the first entry whose term differs), and it commits up
    to the end of its log (rule 5: up to the append's last entry only: the entries after it
    are not known to be the leader's). So an append delivered late, or sent again from an
    earlier next index, cut a follower's log below what it had applied and what its leader
    counted it as holding; the shorter log could then vote a leader in that lacks committed
    entries (a chaos run's lost writes), and a kill in that window left a stored commit index
    past the journal's end. Here a repeated entry is kept, and the log is cut only where an
    entry conflicts."""
    if not _follows(sync, node, message):
        if message["term"] < sync._SyncObj__raftCurrentTerm:
            return  # a deposed leader's: ignored, as stock ignores it
        # A new term or a new leader: stock's own bookkeeping (term, vote, leader, state,
        # election deadline), from the append without its entries, taken below.
        commit = sync._SyncObj__raftCommitIndex
        heartbeat = {"type": "append_entries", "term": message["term"], "commit_index": commit}
        SyncObj._SyncObj__onMessageReceived(sync, node, heartbeat)
        assert _follows(sync, node, message), "stock did not make this replica a follower"
    elif not sync._SyncObj__transferInProgress:
        # During a leadership transfer, the outgoing leader's appends must not postpone the
        # election it asked for (stock's rule).
        timeout_s: float = sync._SyncObj__generateRaftTimeout()
        sync._SyncObj__raftElectionDeadline = pysyncobj_clock() + timeout_s
    journal: Any = sync._SyncObj__raftLog
    prev: int = message["prevLogIdx"]
    entries: list[tuple[bytes, int, int]] = message["entries"]
    last = journal[-1]
    if prev == last[1] and message["prevLogTerm"] == last[2]:
        for entry in entries:  # the steady state: the entries go right after the last one
            journal.add(*entry)
    elif not _holds(sync, node, prev, message["prevLogTerm"]):
        return
    else:
        _merge(sync, entries)
    last_new = prev + len(entries)
    sync._SyncObj__sendNextNodeIdx(node, nextNodeIdx=last_new + 1, success=True)
    leader_commit: int = message["commit_index"]
    sync._SyncObj__leaderCommitIndex = leader_commit
    commit = min(leader_commit, last_new)
    if commit > sync._SyncObj__raftCommitIndex:
        sync._SyncObj__raftCommitIndex = commit
        journal.setRaftCommitIndex(commit)


def _follows(sync: Any, node: Any, message: dict[str, Any]) -> bool:
    """This replica follows `node`, the leader of the append's term."""
    return bool(
        message["term"] == sync._SyncObj__raftCurrentTerm
        and sync._SyncObj__raftState == _RAFT_STATE.FOLLOWER
        and sync._SyncObj__raftLeader == node
    )


def _holds(sync: Any, node: Any, prev: int, prev_term: int) -> bool:
    """Rule 2: the log holds the append's previous entry. If not, the reply says so (stock's
    answers: where the log ends when the entry is past it or below its compacted prefix, the
    entry's own index when its term differs) and the leader sends from there."""
    journal: Any = sync._SyncObj__raftLog
    first, last = journal[0][1], journal[-1][1]
    if not first <= prev <= last:
        sync._SyncObj__sendNextNodeIdx(node, success=False, reset=True)
        return False
    if journal[prev - first][2] != prev_term:
        sync._SyncObj__sendNextNodeIdx(node, nextNodeIdx=prev, success=False, reset=True)
        return False
    return True


def _merge(sync: Any, entries: list[tuple[bytes, int, int]]) -> None:
    """Rules 3 and 4, for entries that follow an entry the log holds: skip those the log holds
    already (same index and term), cut the log at the first that conflicts, append the rest."""
    journal: Any = sync._SyncObj__raftLog
    first = journal[0][1]
    new = len(entries)
    for position, (_command, index, term) in enumerate(entries):
        if index > journal[-1][1]:
            new = position
            break
        if journal[index - first][2] != term:
            _truncate_from(sync, index)
            new = position
            break
    for entry in entries[new:]:
        journal.add(*entry)


def _truncate_from(sync: Any, index: int) -> None:
    """Delete the log's entries from `index` on (they conflict with the leader's). An applied
    entry can only conflict if a write this replica acknowledged was lost (a power cut without
    `fsync`): logged as pysyncobj logs it, and chaos runs count it."""
    applied: int = sync._SyncObj__raftLastApplied
    if index <= applied:
        log.critical(APPLIED_TRUNCATION, index, applied)
    journal: Any = sync._SyncObj__raftLog
    journal.deleteEntriesFrom(index - journal[0][1])
    if sync._SyncObj__raftCommitIndex >= index:  # not committed after all: stock's rule too
        sync._SyncObj__raftCommitIndex = index - 1
        journal.setRaftCommitIndex(index - 1)


def take_reply(sync: Any, node: Any, message: dict[str, Any]) -> None:
    """On a leader: a follower's reply to an append (pysyncobj's leader branch, the only one
    that takes it), with two fixes: the stock leader assigns a follower's next index from
    every successful reply, so with pipelined appends an older reply rewinds it, and the
    follower is then sent entries it already holds: the larger index is kept. And a reply
    carries no term in stock pysyncobj, so one to an append of an earlier term (delivered
    late, after a cut link healed, or sent to this node's earlier leadership) would set a
    match index the follower's log no longer backs, and commit entries a majority does not
    hold: a reply of another term than the leader's is dropped (`PatchedSyncObj.
    _SyncObj__sendNextNodeIdx` stamps it)."""
    if message.get("term") != sync._SyncObj__raftCurrentTerm:
        return
    next_index: int = message["next_node_idx"]
    next_indexes: dict[Any, int] = sync._SyncObj__raftNextIndex
    if message["reset"]:
        next_indexes[node] = next_index
    if message["success"]:
        match: dict[Any, int] = sync._SyncObj__raftMatchIndex
        if match[node] < next_index - 1:
            match[node] = next_index - 1
            next_indexes[node] = max(next_indexes.get(node, next_index), next_index)
    sync._SyncObj__lastResponseTime[node] = pysyncobj_clock()
