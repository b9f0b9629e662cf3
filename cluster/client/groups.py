"""Consumer-group administration: list, describe (with lag), delete, and reset offsets.

Role: what `raftbroker groups ...` and applications use to look after groups, as Kafka's
`kafka-consumer-groups` does. Every group request goes to the group's coordinator through
`Client.call_coordinator` (which rides out coordinator moves); ListGroups asks every node,
since each lists only the groups it coordinates.

Rules:
- A refusal names its group and why (`group 'etl' has 2 members: ...`); the broker's code is
  the error's `.error`.
- Offsets are reset only while the group is empty (no member could be reading them), as
  Kafka's tool: the commit is an administrator's one (generation -1, no member id), which the
  coordinator takes only from outside a live generation. A target outside the log is moved to
  its nearer end, as Kafka's tool does.
- `describe` shows, per partition the group has committed or been assigned, the committed
  offset, the log end (high watermark) and the lag between them, and which member owns it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cluster import native as p
from cluster.client.admin import Admin
from cluster.client.consumer_protocol import (
    PROTOCOL_TYPE,
    ConsumerProtocolError,
    decode_assignment,
)
from cluster.client.errors import ClientError
from cluster.client.group_consumer import fetch_committed
from cluster.client.metadata import Client
from statemachine.errors import ErrorCode

NO_OFFSET = -1
EMPTY_STATES = frozenset({"Empty", "Dead"})
ADMIN_GENERATION = -1  # an OffsetCommit from outside the group


@dataclass(frozen=True, slots=True)
class GroupListing:
    group: str
    protocol_type: str
    state: str


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    instance_id: str
    client_id: str
    host: str
    partitions: tuple[tuple[str, int], ...]  # from its assignment, when a consumer's


@dataclass(frozen=True, slots=True)
class PartitionLag:
    topic: str
    partition: int
    committed: int  # -1: the group has committed none
    log_end: int  # -1: unknown (the partition is gone or its leader did not answer)
    member_id: str  # "" when no member owns it

    @property
    def lag(self) -> int | None:
        if self.committed < 0 or self.log_end < 0:
            return None
        return max(self.log_end - self.committed, 0)


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group: str
    state: str
    protocol_type: str
    protocol: str
    members: tuple[MemberDescription, ...]
    partitions: tuple[PartitionLag, ...]


@dataclass(frozen=True, slots=True)
class ResetTarget:
    """Where `reset_offsets` moves a group: EARLIEST, LATEST, an offset, or the first offset
    appended at or after a time (ms since the epoch)."""

    spec: int  # p.EARLIEST, p.LATEST, or a time in ms
    offset: int | None = None  # an exact offset instead of `spec`

    @classmethod
    def to_offset(cls, offset: int) -> ResetTarget:
        return cls(p.EARLIEST, offset)


class Groups:
    """The consumer groups of a cluster."""

    def __init__(self, cluster: Client) -> None:
        self.cluster = cluster
        self.admin = Admin(cluster)

    async def list(self, *, timeout_s: float | None = None) -> list[GroupListing]:
        """Every group, from every node (each lists the groups it coordinates)."""
        found: dict[str, GroupListing] = {}
        for response in await self.cluster.ask_every_broker(p.ListGroups(), timeout_s):
            assert isinstance(response, p.ListGroupsResponse)
            for g in response.groups:
                found[g.group] = GroupListing(g.group, g.protocol_type, g.state)
        return [found[name] for name in sorted(found)]

    async def describe(self, group: str, *, timeout_s: float | None = None) -> GroupDescription:
        """The group's state, members and, per partition, committed offset, log end and lag;
        ClientError(GROUP_ID_NOT_FOUND) for a group that does not exist."""
        described = await self._call(group, p.DescribeGroup(group), timeout_s)
        assert isinstance(described, p.DescribeGroupResponse)
        committed = await self.committed(group, timeout_s=timeout_s)
        if described.state == "Dead" and not committed:
            raise ClientError(ErrorCode.GROUP_ID_NOT_FOUND, f"group {group!r} does not exist")
        members = tuple(_member(described.protocol_type, m) for m in described.members)
        owner = {tp: m.member_id for m in members for tp in m.partitions}
        keys = sorted(set(committed) | set(owner))
        partitions = []
        for topic, partition in keys:
            log_end = await self._log_end(topic, partition, timeout_s)
            partitions.append(
                PartitionLag(
                    topic,
                    partition,
                    committed.get((topic, partition), NO_OFFSET),
                    log_end,
                    owner.get((topic, partition), ""),
                )
            )
        return GroupDescription(
            group,
            described.state,
            described.protocol_type,
            described.protocol_name,
            members,
            tuple(partitions),
        )

    async def committed(
        self,
        group: str,
        partitions: Iterable[tuple[str, int]] = (),
        *,
        timeout_s: float | None = None,
        require_stable: bool = False,
    ) -> dict[tuple[str, int], int]:
        """The group's committed offsets of `partitions` (of every partition it has: empty),
        leaving out those it has none for; `require_stable`: after the transactions that
        have offsets of them pending end (KIP-447)."""
        return await fetch_committed(
            lambda request: self._call(group, request, timeout_s),
            group,
            tuple(partitions),
            require_stable=require_stable,
        )

    async def delete(self, group: str, *, timeout_s: float | None = None) -> None:
        """Delete an empty group and its committed offsets."""
        await self._call(group, p.DeleteGroup(group), timeout_s)

    async def reset_offsets(
        self,
        group: str,
        topic: str,
        target: ResetTarget,
        partitions: Iterable[int] | None = None,
        *,
        execute: bool = True,
        timeout_s: float | None = None,
    ) -> dict[int, int]:
        """Move the group's offsets of `topic` (its `partitions`, default all) to `target`
        while the group is empty; the new offset of each partition. `execute=False` computes
        them only (Kafka's dry run)."""
        described = await self._call(group, p.DescribeGroup(group), timeout_s)
        assert isinstance(described, p.DescribeGroupResponse)
        if described.state not in EMPTY_STATES:
            held = len(described.members)
            raise ClientError(
                ErrorCode.NON_EMPTY_GROUP,
                f"group {group!r} is {described.state} with {held} member"
                f"{'' if held == 1 else 's'}: offsets can be reset only while it is empty "
                "(stop its consumers first)",
            )
        infos = await self.cluster.partitions(topic, timeout_s=timeout_s)
        wanted = sorted({i.partition for i in infos} if partitions is None else set(partitions))
        known = {i.partition for i in infos}
        if missing := [i for i in wanted if i not in known]:
            raise ClientError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"topic {topic!r} has no partition {missing[0]} ({len(known)} partitions)",
            )
        offsets = {i: await self._target(topic, i, target, timeout_s) for i in wanted}
        if execute:
            await self._commit_as_admin(group, topic, offsets, timeout_s)
        return offsets

    async def _target(
        self, topic: str, partition: int, target: ResetTarget, timeout_s: float | None
    ) -> int:
        if target.offset is None:
            return await self.admin.list_offsets(topic, partition, target.spec, timeout_s=timeout_s)
        start = await self.admin.list_offsets(topic, partition, p.EARLIEST, timeout_s=timeout_s)
        end = await self.admin.list_offsets(topic, partition, p.LATEST, timeout_s=timeout_s)
        return min(max(target.offset, start), end)

    async def _commit_as_admin(
        self, group: str, topic: str, offsets: dict[int, int], timeout_s: float | None
    ) -> None:
        entries = tuple(p.CommitEntry(topic, i, o, "") for i, o in sorted(offsets.items()))
        request = p.OffsetCommit(group, ADMIN_GENERATION, "", "", entries)
        response = await self.cluster.call_coordinator(group, request, timeout_s=timeout_s)
        assert isinstance(response, p.OffsetCommitResponse)
        for r in response.results:
            if r.error != ErrorCode.NONE:
                raise _refused(group, ErrorCode(r.error), f" ({r.topic}-{r.partition})")

    async def _log_end(self, topic: str, partition: int, timeout_s: float | None) -> int:
        try:
            return await self.admin.list_offsets(topic, partition, p.LATEST, timeout_s=timeout_s)
        except ClientError:
            return NO_OFFSET

    async def _call(self, group: str, request: p.Request, timeout_s: float | None) -> p.Response:
        """The coordinator's answer; its group error raised, naming the group."""
        response = await self.cluster.call_coordinator(group, request, timeout_s=timeout_s)
        error = ErrorCode(getattr(response, "error", ErrorCode.NONE))
        if error != ErrorCode.NONE:
            raise _refused(group, error)
        return response


def _member(protocol_type: str, m: p.DescribedMember) -> MemberDescription:
    owned: tuple[tuple[str, int], ...] = ()
    if protocol_type == PROTOCOL_TYPE:
        try:
            assignment = decode_assignment(m.assignment)
        except ConsumerProtocolError:
            assignment = {}  # a member's bytes we cannot read: shown without partitions
        owned = tuple(sorted((t, i) for t, ps in assignment.items() for i in ps))
    return MemberDescription(m.member_id, m.instance_id, m.client_id, m.client_host, owned)


def _refused(group: str, error: ErrorCode, where: str = "") -> ClientError:
    match error:
        case ErrorCode.GROUP_ID_NOT_FOUND:
            why = "does not exist"
        case ErrorCode.NON_EMPTY_GROUP:
            why = "has members: it can be deleted only while empty (stop its consumers first)"
        case ErrorCode.INVALID_GROUP_ID:
            why = "is not a valid group id"
        case ErrorCode.UNKNOWN_MEMBER_ID:
            why = "has members: offsets can be reset only while it is empty"
        case _:
            why = f"refused: {error.name}"
    return ClientError(error, f"group {group!r} {why}{where}")
