"""The group coordinator: the classic consumer-group protocol, sans I/O, on the node that runs
it (the leader of an offsets partition; it was in statemachine/, which holds only what
replicas apply).

Role: the leader of an offsets partition (the coordinator of the groups that hash to it) keeps
one `Coordinator` for them. Each call takes a request or the time and returns `Effect`s: a
`Reply` to a request (now, or later for a JoinGroup or SyncGroup parked until the rebalance
moves on) and `Persist`, a group record the caller must commit through the partition's Raft
log before `persisted` is called (the end of a rebalance, a static member's new id, a group
left empty). The caller owns the sockets, the Raft proposals and the clock.

Rules:
- Pure, as the replicated state machines are: no I/O, no clock, no randomness
  (tests/unit/test_purity.py holds this package to statemachine/'s rules). Time is the
  caller's `now_ms` (the coordinator's own clock: session and rebalance timers decide nothing
  on replicas; what they decide reaches replicas only as a persisted record). Member ids come
  from the caller's `new_member_id`.
- Kafka's classic protocol (kafka.coordinator.group.GroupCoordinator), its states, error codes
  and timers: Empty, PreparingRebalance, CompletingRebalance, Stable, Dead; KIP-394's
  MEMBER_ID_REQUIRED, KIP-345's static members, the initial rebalance delay, and members that
  do not sync within their rebalance timeout dropped (KIP-814's pending-sync timeout).
- A group's state changes only by the table in states.py (`TRANSITIONS`), one place.
- A coordinator starts from the replicated records (`load`): a group with members resumes
  Stable in its generation, and every session timer restarts now.

Modules, each importing only those before it: states.py (the states and the table of moves),
messages.py (limits, requests, answers, effects, views), group.py (a group and its members as
the coordinator holds them), coordinator.py (`Coordinator`).
"""

from cluster.broker.coordinator.coordinator import Coordinator
from cluster.broker.coordinator.messages import (
    NO_GENERATION,
    NO_MEMBER,
    CoordinatorLimits,
    Effect,
    GroupView,
    JoinMember,
    JoinRequest,
    JoinResult,
    MemberRef,
    MemberView,
    Persist,
    Protocol,
    Reply,
    SyncRequest,
    SyncResult,
)
from cluster.broker.coordinator.states import TRANSITIONS, Event, GroupState

__all__ = [
    "NO_GENERATION",
    "NO_MEMBER",
    "TRANSITIONS",
    "Coordinator",
    "CoordinatorLimits",
    "Effect",
    "Event",
    "GroupState",
    "GroupView",
    "JoinMember",
    "JoinRequest",
    "JoinResult",
    "MemberRef",
    "MemberView",
    "Persist",
    "Protocol",
    "Reply",
    "SyncRequest",
    "SyncResult",
]
