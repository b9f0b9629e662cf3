"""A consumer group as the log keeps it: the record written at the end of each rebalance.

Role: what must survive a coordinator failover of a group's membership: its generation,
protocol, leader, and each member with its subscription and assignment and static instance id
(`GroupRecord`). The coordinator (cluster/broker/coordinator/) builds one when a
rebalance ends; the offsets partition's state machine (statemachine/offsets.py) stores it; a
new coordinator resumes from it.

Rules: encoded as plain msgpack values; decoding is strict and total (`RecordError` and
nothing else), since a record arrives inside an entry from the network: an entry whose record
does not decode is a committed rejection, never a crash.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from statemachine.codec import pack

INT32_MAX = 2**31 - 1


class RecordError(ValueError):
    """Bytes that are not a group record."""


class MemberRecord(NamedTuple):
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    subscription: bytes  # the member's metadata for the group's protocol
    assignment: bytes


class GroupRecord(NamedTuple):
    generation: int
    protocol_type: str
    protocol_name: str  # "" while the group is Empty
    leader: str  # "" while the group is Empty
    members: tuple[MemberRecord, ...]

    def encode(self) -> bytes:
        return pack([self.generation, self.protocol_type, self.protocol_name, self.leader,
                     [list(m) for m in self.members]])  # fmt: skip

    def as_value(self) -> list[Any]:
        """The plain value a snapshot embeds."""
        return [self.generation, self.protocol_type, self.protocol_name, self.leader,
                [list(m) for m in self.members]]  # fmt: skip


def group_record_of(value: object) -> GroupRecord:
    """The record in a decoded plain value, every field checked."""
    if not isinstance(value, tuple) or len(value) != 5:
        raise RecordError("a group record is [generation, type, protocol, leader, members]")
    generation, protocol_type, protocol_name, leader, members = value
    _int(generation, "generation")
    for name, text in (("protocol type", protocol_type), ("protocol", protocol_name),
                       ("leader", leader)):  # fmt: skip
        _str(text, name)
    if not isinstance(members, tuple):
        raise RecordError("members: expected a list")
    decoded = tuple(_member(m) for m in members)
    ids = {m.member_id for m in decoded}
    if len(ids) != len(decoded):
        raise RecordError("a member id twice")
    if (leader or decoded) and leader not in ids:
        raise RecordError("the leader is not a member")
    return GroupRecord(generation, protocol_type, protocol_name, leader, decoded)


def _member(value: object) -> MemberRecord:
    if not isinstance(value, tuple) or len(value) != len(MemberRecord._fields):
        raise RecordError(f"a member is {len(MemberRecord._fields)} fields")
    member_id, instance_id, client_id, client_host, session, rebalance, sub, assignment = value
    _str(member_id, "member id")
    if not member_id:
        raise RecordError("an empty member id")
    if instance_id is not None:
        _str(instance_id, "instance id")
    _str(client_id, "client id")
    _str(client_host, "client host")
    _int(session, "session timeout")
    _int(rebalance, "rebalance timeout")
    for name, blob in (("subscription", sub), ("assignment", assignment)):
        if type(blob) is not bytes:
            raise RecordError(f"{name}: expected bytes")
    return MemberRecord(member_id, instance_id, client_id, client_host, session, rebalance, sub,
                        assignment)  # fmt: skip


def _int(value: object, what: str) -> None:
    if type(value) is not int or not 0 <= value <= INT32_MAX:
        raise RecordError(f"{what}: expected an int32 >= 0, got {value!r}")


def _str(value: object, what: str) -> None:
    if type(value) is not str:
        raise RecordError(f"{what}: expected a string, got {type(value).__name__}")
