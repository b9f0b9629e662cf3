"""Consumer-group administration on this node: DescribeGroups, ListGroups, DeleteGroups and
OffsetDelete, for both listeners.

Role: part of the consumer groups' service (groups.py's `GroupService` mixes it in, and gives
it the seats: each offsets partition hosted here, with its coordinator while this node leads
it). Reads come from the coordinator and the replicated offsets; deletions are proposed to the
group's offsets partition and answered once committed.

Rules (Kafka's):
- DeleteGroups: only a group without members (Empty, or Dead with offsets left), else
  NON_EMPTY_GROUP.
- OffsetDelete: a group that neither has members nor offsets is GROUP_ID_NOT_FOUND; a group
  with members of another protocol type than "consumer" NON_EMPTY_GROUP; with consumer
  members, a partition of a topic some member subscribes to (or of any topic, when their
  subscriptions cannot be read) GROUP_SUBSCRIBED_TO_TOPIC and kept; a partition that does
  not exist UNKNOWN_TOPIC_OR_PARTITION; the rest go (NONE also where none was committed).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import NamedTuple

from cluster.broker.coordinator import (
    Coordinator,
    GroupState,
    GroupView,
    JoinResult,
    SyncResult,
)
from cluster.broker.node import Node, OffsetsHandle
from statemachine.codec import pack
from statemachine.commands import DeleteGroup, DeleteOffsets
from statemachine.errors import ErrorCode

CONSUMER_PROTOCOL = "consumer"


class Listing(NamedTuple):
    group_id: str
    protocol_type: str
    state: GroupState


Parked = asyncio.Future[JoinResult | SyncResult]


@dataclass
class Seat:
    """One offsets partition hosted here, and its coordinator while this node leads it."""

    handle: OffsetsHandle
    coordinator: Coordinator | None = None
    term: int = -1
    waiting: dict[int, Parked] = field(default_factory=dict)


class GroupAdmin:
    """Mixed into `GroupService`, which finds each group's seat and proposes to it."""

    node: Node

    def _seat_for(self, group_id: str) -> Seat | ErrorCode:
        raise NotImplementedError  # GroupService's

    def _refresh(self, partition: int, handle: OffsetsHandle) -> Seat:
        raise NotImplementedError  # GroupService's

    def _hosted(self) -> list[tuple[int, OffsetsHandle]]:
        raise NotImplementedError  # GroupService's

    async def _propose(self, seat: Seat, command: bytes) -> ErrorCode:
        raise NotImplementedError  # GroupService's

    def describe(self, group_id: str) -> tuple[ErrorCode, GroupView]:
        seat = self._seat_for(group_id)
        if isinstance(seat, ErrorCode):
            return seat, GroupView(group_id, GroupState.DEAD, "", "", ())
        assert seat.coordinator is not None
        view = seat.coordinator.describe(group_id)
        if view.state is GroupState.DEAD and group_id in seat.handle.replica.machine.groups:
            view = view._replace(state=GroupState.EMPTY)  # offsets, no members
        return ErrorCode.NONE, view

    def listing(self) -> list[Listing]:
        """Every group whose coordinator is this node (ListGroups asks each broker)."""
        found: dict[str, Listing] = {}
        for partition, handle in self._hosted():
            seat = self._refresh(partition, handle)
            if seat.coordinator is None:
                continue
            for group_id in handle.replica.machine.groups:
                found[group_id] = Listing(group_id, "", GroupState.EMPTY)
            for group_id, protocol_type, state in seat.coordinator.listing():
                found[group_id] = Listing(group_id, protocol_type, state)
        return [found[g] for g in sorted(found)]

    async def delete(self, group_id: str) -> ErrorCode:
        seat = self._seat_for(group_id)
        if isinstance(seat, ErrorCode):
            return seat
        assert seat.coordinator is not None
        state = seat.coordinator.state(group_id)
        if state not in (GroupState.EMPTY, GroupState.DEAD):
            return ErrorCode.NON_EMPTY_GROUP
        if group_id not in seat.handle.replica.machine.groups:
            seat.coordinator.forget(group_id)
            return ErrorCode.GROUP_ID_NOT_FOUND if state is GroupState.DEAD else ErrorCode.NONE
        error = await self._propose(seat, DeleteGroup(group_id).encode())
        if error is ErrorCode.NONE and seat.coordinator is not None:
            seat.coordinator.forget(group_id)
        return error

    async def delete_offsets(
        self, group_id: str, partitions: list[tuple[str, int]]
    ) -> tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]:
        """The group's error, and each partition's: NONE where its offset went (or there was
        none), GROUP_SUBSCRIBED_TO_TOPIC where a member reads its topic."""
        seat = self._seat_for(group_id)
        if isinstance(seat, ErrorCode):
            return seat, {}
        assert seat.coordinator is not None
        view = seat.coordinator.describe(group_id)
        if view.state is GroupState.DEAD and group_id not in seat.handle.replica.machine.groups:
            return ErrorCode.GROUP_ID_NOT_FOUND, {}
        read: frozenset[str] | None = frozenset()  # the topics members read (None: any)
        if view.members:
            if view.protocol_type not in ("", CONSUMER_PROTOCOL):
                return ErrorCode.NON_EMPTY_GROUP, {}
            read = seat.coordinator.subscriptions(group_id)
        errors = {tp: self._offset_delete_refusal(tp, read) for tp in partitions}
        doomed = sorted(tp for tp, error in errors.items() if error is ErrorCode.NONE)
        if doomed:
            error = await self._propose(seat, DeleteOffsets(group_id, pack(doomed)).encode())
            if error is not ErrorCode.NONE:
                return error, {}
        return ErrorCode.NONE, errors

    def _offset_delete_refusal(self, tp: tuple[str, int], read: frozenset[str] | None) -> ErrorCode:
        topic = self.node.metadata_replica.machine.topics.get(tp[0])
        if topic is None or not 0 <= tp[1] < topic.partitions:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if read is None or tp[0] in read:
            return ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
        return ErrorCode.NONE
