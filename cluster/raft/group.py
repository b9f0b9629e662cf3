"""A Raft group as the broker sees it: propose a command, read the machine, report health.

Role: `RaftGroup` is the event-loop side of one replica. `propose()` replicates `bytes` and
returns the apply result on the caller's loop, or raises `ProposalError` with a retriable
`ErrorCode` when leadership is lost, the proposal times out, or too many are in flight
(`ProposalQueueFullError`); `submit()` is the same for callers that want the outcome the
moment it is known.

Rules: runs on the driver's loop only; every proposal is settled exactly once (`_Proposal`),
by pysyncobj's verdict, its timeout or a deposition, whichever comes first; the number in
flight is bounded per group. pysyncobj itself is the adapter's (adapter/): this module uses
only what `PatchedSyncObj` defines and pysyncobj's public properties.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial
from typing import TypeVar

from cluster.raft.adapter import APPLIED, PatchedSyncObj, failure
from cluster.raft.spec import GroupSpec, GroupStatus, ProposalError, ProposalQueueFullError
from statemachine.errors import ErrorCode

T = TypeVar("T")

# A replica whose applied index trails its commit index for this long is reported unhealthy.
STALL_REPORT_S = 5.0
# A follower that has not held, for this long, all that its leader had committed is out of
# sync (Kafka's replica.lag.time.max.ms); one whose link is down is out of sync at once.
IN_SYNC_LAG_S = 5.0


class RaftGroup:
    """The event-loop side of one group: propose, and read its leadership and progress."""

    def __init__(
        self,
        spec: GroupSpec,
        sync: PatchedSyncObj,
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
        self._catch_up: dict[str, _CatchUp] = {}
        self._waiting: set[_Proposal] = set()
        sync.raftbroker_on_deposed = self._fail_waiting

    def _fail_waiting(self) -> None:
        """A deposed leader cannot tell whether its pending entries will commit: fail them
        retriably now (docs/semantics.md, "Leadership") rather than when the client times
        out; a retry that meets a committed original is deduplicated."""
        error = ProposalError(ErrorCode.NOT_LEADER_OR_FOLLOWER, leader=self.leader_address or "")
        for proposal in list(self._waiting):
            proposal.finish(None, error)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def is_leader(self) -> bool:
        return bool(self._sync.is_leader())

    @property
    def serving(self) -> bool:
        """Leader, and every entry of earlier terms is applied (the term-start barrier)."""
        noop = self._sync.noop_index
        return self.is_leader and noop is not None and self._sync.raftLastApplied >= noop

    @property
    def term(self) -> int:
        """The Raft term this replica is in (what `status` reports, without the rest of it)."""
        return int(self._sync.raftCurrentTerm)

    @property
    def leader_address(self) -> str | None:
        leader = self._sync.leader()
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
            raise ProposalError(ErrorCode.NOT_LEADER_OR_FOLLOWER, leader=self.leader_address or "")
        if self._pending >= self._max_pending:
            raise ProposalQueueFullError(self._max_pending)
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
            self.term,
            commit,
            applied,
            healthy,
            detail,
            self._in_sync(commit, time.monotonic()),
            sync.journal_bytes(),
        )

    def _in_sync(self, commit: int, now: float) -> tuple[str, ...]:
        """On a leader: itself and the followers in sync, as Kafka keeps its ISR. A follower is
        in sync while its link is open and it held, within the last `IN_SYNC_LAG_S`, all that
        this leader had committed at that moment (not "is at the commit index now", which a
        follower under a steady stream of writes may never be when asked)."""
        if not self.is_leader:
            self._catch_up.clear()  # a later leadership starts from what it sees then
            return ()
        connected = self._sync.connected_followers()
        in_sync = [self.spec.self_address]
        for address, match in self._sync.follower_match_indexes().items():
            catch_up = self._catch_up.setdefault(address, _CatchUp(commit, now, now))
            catch_up.observe(match, commit, now)
            if address in connected and now - catch_up.caught_up_at <= IN_SYNC_LAG_S:
                in_sync.append(address)
        return tuple(in_sync)

    def _health(self, commit: int, applied: int) -> tuple[bool, str]:
        now = time.monotonic()
        if applied < commit and applied == self._last_applied_seen:
            self._stall_since = self._stall_since or now
        else:
            self._stall_since = None
        self._last_applied_seen = applied
        if self._sync.raftbroker_tick_errors:
            return False, f"{self._sync.raftbroker_tick_errors} failed ticks"
        if self._sync.raftbroker_refused_messages:
            # A peer that sent entries not of ours is broken or hostile: an operator must look.
            return False, f"{self._sync.raftbroker_refused_messages} refused peer messages"
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
                lagging.append(f"{self.spec.label(address)} at {match}")
        return lagging


Done = Callable[[object, "ProposalError | None"], None]


class _CatchUp:
    """When a follower last held all that its leader had committed (Kafka's
    lastCaughtUpTime): each observation sets a target, the commit index of that moment, and a
    later observation that finds the follower at or past it dates its catch-up to then."""

    __slots__ = ("caught_up_at", "target", "target_at")

    def __init__(self, target: int, target_at: float, caught_up_at: float) -> None:
        self.target = target
        self.target_at = target_at
        self.caught_up_at = caught_up_at

    def observe(self, match: int, commit: int, now: float) -> None:
        if match >= commit:
            self.caught_up_at = now
        elif match >= self.target:
            self.caught_up_at = self.target_at
        else:
            return  # still short of the last target: keep it, and its moment
        self.target, self.target_at = commit, now


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
        if error == APPLIED:
            self.finish(result, None)
        else:
            self.finish(None, ProposalError(failure(error)))

    def expire(self) -> None:
        leader = self.group.leader_address or ""
        self.finish(None, ProposalError(ErrorCode.REQUEST_TIMED_OUT, leader=leader))

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
