"""A consumer group's states and every move between them, in one table (as h11's `_state.py`).

Role: Kafka's classic group protocol names five states (kafka.coordinator.group.GroupState);
`TRANSITIONS` says which event moves a group from which state to which, and `next_state` is
the only way a group's state changes (`Group.move`). A move the table does not hold is a bug
in the coordinator, not a request to refuse: it is an assert.

The moves, as Kafka's GroupCoordinator makes them:
- REBALANCE: a member joins, leaves, changes its protocols, or a commit of the group's record
  fails: every member must join again (PreparingRebalance).
- JOINED: the join phase ends (everyone rejoined, or the rebalance timeout passed) with
  members: the leader is to assign (CompletingRebalance).
- EMPTIED: the join phase ends with nobody left (Empty).
- ASSIGNED: the leader's assignment is committed through the log (Stable).
Dead is a group the coordinator no longer holds (deleted, expired, or leadership lost): no
move leads there; the group is dropped.
"""

from __future__ import annotations

from enum import Enum


class GroupState(Enum):
    """Kafka's names, as DescribeGroups and ListGroups report them."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


class Event(Enum):
    """What moves a group (the module docstring says when each happens)."""

    REBALANCE = "every member must join again"
    JOINED = "the join phase ended with members"
    EMPTIED = "the join phase ended with no member"
    ASSIGNED = "the leader's assignment is committed"


TRANSITIONS: dict[tuple[GroupState, Event], GroupState] = {
    (GroupState.EMPTY, Event.REBALANCE): GroupState.PREPARING_REBALANCE,
    (GroupState.STABLE, Event.REBALANCE): GroupState.PREPARING_REBALANCE,
    (GroupState.COMPLETING_REBALANCE, Event.REBALANCE): GroupState.PREPARING_REBALANCE,
    (GroupState.PREPARING_REBALANCE, Event.JOINED): GroupState.COMPLETING_REBALANCE,
    (GroupState.PREPARING_REBALANCE, Event.EMPTIED): GroupState.EMPTY,
    (GroupState.COMPLETING_REBALANCE, Event.ASSIGNED): GroupState.STABLE,
}


def next_state(state: GroupState, event: Event) -> GroupState:
    """Where `event` moves a group in `state`; a move the table lacks is a broken invariant."""
    target = TRANSITIONS.get((state, event))
    assert target is not None, f"a group in {state.value} cannot move on {event.name}"
    return target
