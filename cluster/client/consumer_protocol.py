"""Kafka's consumer protocol: what a consumer group's members put in their opaque bytes.

Role: a member of a group of protocol type "consumer" sends its subscription in JoinGroup and
receives its assignment in SyncGroup, both in the layout of Kafka's ConsumerProtocol (the
embedded `ConsumerProtocolSubscription` and `ConsumerProtocolAssignment` schemas, big-endian,
Kafka's classic strings and arrays). Speaking it lets a native consumer share a group with
Kafka's clients, and lets `groups describe` show any consumer's assignment. The range assignor
(Kafka's default `RangeAssignor`) is here too: the group's leader runs it.

Rules:
- Encoding writes version 0, which every client reads. Decoding reads any version: the fields
  of version 0 first, and what later versions add after them is ignored, as Kafka's own
  readers do for versions they do not know.
- Decoding is strict: bytes that do not hold a whole version-0 body raise
  `ConsumerProtocolError`, never anything else.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence

PROTOCOL_TYPE = "consumer"
RANGE = "range"
VERSION = 0
_I16, _I32 = struct.Struct(">h"), struct.Struct(">i")
NO_USER_DATA = _I32.pack(0)  # empty user data, as the Python clients write it

Assignment = dict[str, tuple[int, ...]]  # topic -> partitions


class ConsumerProtocolError(ValueError):
    """Bytes that are not a consumer-protocol subscription or assignment."""


class _Reader:
    def __init__(self, data: bytes) -> None:
        self._data, self._at = data, 0

    def _take(self, size: int) -> bytes:
        if size < 0 or self._at + size > len(self._data):
            raise ConsumerProtocolError("truncated consumer-protocol bytes")
        chunk = self._data[self._at : self._at + size]
        self._at += size
        return chunk

    def i16(self) -> int:
        return int(_I16.unpack(self._take(2))[0])

    def i32(self) -> int:
        return int(_I32.unpack(self._take(4))[0])

    def string(self) -> str:
        try:
            return self._take(self.i16()).decode()
        except UnicodeDecodeError as exc:
            raise ConsumerProtocolError("a topic name that is not UTF-8") from exc

    def count(self) -> int:
        n = self.i32()
        if n < 0 or n > len(self._data):  # each element takes at least a byte
            raise ConsumerProtocolError(f"an array of {n} elements")
        return n


def _string(text: str) -> bytes:
    raw = text.encode()
    return _I16.pack(len(raw)) + raw


def _partitions(topic_partitions: Mapping[str, Iterable[int]]) -> bytes:
    out = [_I32.pack(len(topic_partitions))]
    for topic, partitions in sorted(topic_partitions.items()):
        listed = sorted(partitions)
        out += [_string(topic), _I32.pack(len(listed)), *(_I32.pack(i) for i in listed)]
    return b"".join(out)


def encode_subscription(topics: Iterable[str]) -> bytes:
    names = sorted(set(topics))
    return b"".join([_I16.pack(VERSION), _I32.pack(len(names)), *map(_string, names), NO_USER_DATA])


def decode_subscription(data: bytes) -> tuple[str, ...]:
    """The topics a member subscribes to."""
    reader = _Reader(data)
    reader.i16()
    return tuple(reader.string() for _ in range(reader.count()))


def encode_assignment(assignment: Mapping[str, Iterable[int]]) -> bytes:
    return _I16.pack(VERSION) + _partitions(assignment) + NO_USER_DATA


def decode_assignment(data: bytes) -> Assignment:
    """A member's partitions by topic (empty bytes: none, as a member without any gets)."""
    if not data:
        return {}
    reader = _Reader(data)
    reader.i16()
    assignment: Assignment = {}
    for _ in range(reader.count()):
        topic = reader.string()
        assignment[topic] = tuple(reader.i32() for _ in range(reader.count()))
    return assignment


def range_assign(
    subscriptions: Mapping[str, Sequence[str]], partition_counts: Mapping[str, int]
) -> dict[str, Assignment]:
    """Kafka's RangeAssignor: per topic, its partitions in ranges over the members that
    subscribe to it, in member-id order, the first ones taking one more when it does not
    divide. A topic without a known partition count is assigned to nobody."""
    assigned: dict[str, Assignment] = {member: {} for member in subscriptions}
    for topic, count in sorted(partition_counts.items()):
        members = sorted(m for m, topics in subscriptions.items() if topic in topics)
        if not members:
            continue
        each, extra = divmod(count, len(members))
        start = 0
        for i, member in enumerate(members):
            size = each + (1 if i < extra else 0)
            if size:
                assigned[member][topic] = tuple(range(start, start + size))
            start += size
    return assigned
