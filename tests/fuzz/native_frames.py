"""Native request frames for the fuzzer, generated from the wire protocol's field rules
(cluster/native/: each field's type, range, length and count), and mutations of them: in
the structure (a value of the wrong type or out of range, an item dropped or added, an array
too long) and in the bytes (bit flips, truncation, length lies).

As in kafka_frames.py, values come from a field's name where it says what it holds, and
writes name only the run's own topics.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from typing import Any

import msgpack

from cluster import native as p
from statemachine import fields as f
from statemachine.errors import ErrorCode
from statemachine.records import Record, encode_batch
from tests.fuzz.kafka_frames import FUZZ_GROUPS, FUZZ_TOPICS, PROTOCOLS, READ_TOPICS

WRITES = (p.Produce, p.FencedProduce, p.CreateTopic, p.DeleteTopic)
ITEMS_MAX = 3
_LENGTH = struct.Struct(">I")


class NativeRequests:
    """Valid native requests of every type, from one seeded generator."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def request(self, cls: type[p.Request] | None = None) -> p.Request:
        cls = cls or self.rng.choice(p.REQUEST_TYPES)
        return self._record(cls, writes=cls in WRITES)  # type: ignore[return-value]

    def _record(self, cls: type[p.Struct], *, writes: bool) -> p.Struct:
        return cls(*(self._value(name, r, writes) for name, r in p.field_rules(cls)))

    def _value(self, name: str, rule: p.Rule, writes: bool) -> Any:
        rng = self.rng
        match rule:
            case p.StructRule(cls=cls):
                return self._record(cls, writes=writes)
            case p.TupleRule(item=item):
                count = rng.randint(1, 2) if rng.random() < 0.8 else rng.randint(0, ITEMS_MAX)
                return tuple(self._value(name, item, writes) for _ in range(count))
            case f.IntRule(lo=lo, hi=hi):
                named = _NAMED_INTS.get(name)
                value = (
                    named(rng)
                    if named is not None and rng.random() < 0.9
                    else rng.randint(lo, min(hi, 1_000))
                )
                return min(max(value, lo), hi)
            case f.BoolRule():
                return rng.random() < 0.2
            case f.StrRule(chars_max=chars_max):
                return self._text(name, writes)[:chars_max]
            case f.BytesRule():
                if name == "batch":
                    return _batch(rng)
                return rng.randbytes(rng.randint(0, 24))
            case f.ErrorCodeRule():
                return rng.choice(list(ErrorCode))
        raise AssertionError(f"no fuzz value for {rule!r}")

    def _text(self, name: str, writes: bool) -> str:
        rng = self.rng
        if name in ("topic", "name"):
            return rng.choice(FUZZ_TOPICS if writes else READ_TOPICS)
        if name == "group":
            return rng.choice(FUZZ_GROUPS)
        if name == "protocol_type":
            return rng.choice(("consumer", ""))
        if name == "transactional_id":
            return rng.choice(("", "", "fz-txn", "x" * 300))
        if name in ("member_id", "instance_id"):
            return rng.choice(("", "", "m-1"))
        return rng.choice(("", "fuzz", *PROTOCOLS, "x" * rng.randint(1, 40)))


def _batch(rng: random.Random) -> bytes:
    records = tuple(
        Record(None, rng.randbytes(rng.randint(0, 30)), 1_700_000_000_000)
        for _ in range(rng.randint(1, 3))
    )
    if rng.random() < 0.7:
        return encode_batch(-1, -1, -1, records)
    return encode_batch(rng.randint(0, 5_000), rng.randint(0, 3), rng.randint(0, 10), records)


_NAMED_INTS: dict[str, Callable[[random.Random], int]] = {
    "partition": lambda r: r.choice((0, 0, 1, 2, 3, 7)),
    "partitions": lambda r: r.choice((1, 2, 3, 0, 5_000)),
    "replication_factor": lambda r: r.choice((1, 2, 3, 4)),
    "timeout_ms": lambda r: r.choice((5_000, 1_000, 0)),
    "max_wait_ms": lambda r: r.choice((0, 0, 50, 500)),
    "offset": lambda r: r.choice((0, 0, 10, 1 << 40)),
    "spec": lambda r: r.choice((-1, -2, -3, 0, 1_700_000_000_000)),
    "session_timeout_ms": lambda r: r.choice((6_000, 10_000, 1_000, 0)),
    "rebalance_timeout_ms": lambda r: r.choice((1_000, 3_000, 0)),
    "transaction_timeout_ms": lambda r: r.choice((60_000, 0)),
    "expected_producer_id": lambda r: r.choice((-1, -1, 1_000)),
    "expected_epoch": lambda r: r.choice((-1, -1, 0)),
    "generation": lambda r: r.choice((-1, 0, 1)),
}


# -- frames and mutations ------------------------------------------------------------------------


def frame(correlation_id: int, request: p.Request) -> bytes:
    return p.encode_request(correlation_id, request)


def mutate(correlation_id: int, request: p.Request, rng: random.Random) -> tuple[str, bytes]:
    """One mutation of `request`'s frame: its name, the bytes."""
    kinds: list[Callable[[int, p.Request, random.Random], bytes]] = [
        _structure,
        _structure,
        _bit_flips,
        _truncation,
        _frame_length_lie,
        _header,
    ]
    kind = rng.choice(kinds)
    return kind.__name__.lstrip("_"), kind(correlation_id, request, rng)


def _body(correlation_id: int, request: p.Request) -> bytes:
    return frame(correlation_id, request)[4:]


def _framed(body: bytes) -> bytes:
    return _LENGTH.pack(len(body)) + body


_GARBAGE: tuple[Any, ...] = (
    None,
    True,
    -1,
    2**63,
    -(2**63),
    2**64 - 1,
    1.5,
    "",
    "x" * 5_000,
    b"\x00",
    [],
    {},
    [[[]]],
    {"a": 1},
)


def _structure(correlation_id: int, request: p.Request, rng: random.Random) -> bytes:
    """A value anywhere in the payload replaced by one of another type or range, an array item
    dropped or repeated."""
    payload = msgpack.unpackb(_body(correlation_id, request), raw=False)

    def visit(node: Any) -> Any:
        if isinstance(node, list) and node and rng.random() < 0.7:
            at = rng.randrange(len(node))
            choice = rng.random()
            if choice < 0.4:
                node[at] = visit(node[at])
            elif choice < 0.6:
                node[at] = rng.choice(_GARBAGE)
            elif choice < 0.8:
                del node[at]
            else:
                node.insert(at, node[at])
            return node
        return rng.choice(_GARBAGE)

    body = [payload[0], payload[1], payload[2], visit(payload[3])]
    if rng.random() < 0.1:
        body = visit(body)
    return _framed(msgpack.packb(body, use_bin_type=True))


def _bit_flips(correlation_id: int, request: p.Request, rng: random.Random) -> bytes:
    body = bytearray(_body(correlation_id, request))
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(body))
        body[at] ^= 1 << rng.randrange(8)
    return _framed(bytes(body))


def _truncation(correlation_id: int, request: p.Request, rng: random.Random) -> bytes:
    body = _body(correlation_id, request)
    return _framed(body[: rng.randrange(len(body))])


def _frame_length_lie(correlation_id: int, request: p.Request, rng: random.Random) -> bytes:
    body = _body(correlation_id, request)
    said = rng.choice((len(body) + 1, len(body) + 1_000, max(len(body) - 2, 0), 2**32 - 1, 0))
    return _LENGTH.pack(said) + body


def _header(correlation_id: int, request: p.Request, rng: random.Random) -> bytes:
    payload = msgpack.unpackb(_body(correlation_id, request), raw=False)
    at = rng.randrange(3)
    payload[at] = rng.choice((*_GARBAGE, 2, 10_000, 2**31))
    return _framed(msgpack.packb(payload, use_bin_type=True))
