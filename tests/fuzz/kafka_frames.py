"""Kafka request frames for the fuzzer, generated from kio's schemas (Kafka's own JSON schemas
as dataclasses): a valid request of any API and version the listener serves, and mutations of
one that know where its lengths, counts, tagged fields and record batches are.

A request is written here field by field from kio's description of the version (its types,
arrays, nullability and tags), not by kio's writer, so that every length and count written is
recorded as a `Site` a mutation can lie in. Values come from the field's name where it says
what it holds (topics from the run's pools, partitions near the real ones, timeouts a node
accepts, record batches that verify) and from its type otherwise, with the type's edges mixed
in. Writes (Produce, CreateTopics, DeleteTopics, DeleteGroups) name only the run's own topics
and groups: a fuzz run never touches the records the adversarial suite guards.
"""

from __future__ import annotations

import dataclasses
import random
import struct
import types
import typing
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from crc32c import crc32c
from kio.index import load_request_schema

from cluster.kafka import codec
from cluster.kafka import messages as m
from statemachine.records import Record, encode_batch

FUZZ_TOPICS = ("fz-0", "fz-1", "fz-2")
READ_TOPICS = (*FUZZ_TOPICS, "known", "fz-none")
FUZZ_GROUPS = ("fzg-0", "fzg-1")
PROTOCOLS = ("range", "roundrobin", "cooperative-sticky")
PARTITIONS_CREATED_MAX = 3  # a valid CreateTopics makes at most this many Raft groups per topic
ITEMS_MAX = 3
LONG_TEXT_CHARS = 2**15 - 1
_INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "timedelta_i32": (-(2**31), 2**31 - 1),
    "timedelta_i64": (-(2**63), 2**63 - 1),
}
_PACK = {
    "int8": struct.Struct(">b"),
    "int16": struct.Struct(">h"),
    "int32": struct.Struct(">i"),
    "int64": struct.Struct(">q"),
    "timedelta_i32": struct.Struct(">i"),
    "timedelta_i64": struct.Struct(">q"),
}
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_HEADER = struct.Struct(">hhih")


@dataclass(frozen=True, slots=True)
class Site:
    """A length or count as written: its bytes' span, how it is encoded, what it said."""

    start: int
    end: int
    encoding: str  # "int16", "int32" or "uvarint"
    value: int  # as the reader sees it: a compact length N+1 is recorded as N, null as -1
    role: str  # "length", "count", "tags" (a tagged-field count) or "tag_size"


@dataclass(frozen=True, slots=True)
class KafkaFrame:
    """A request frame (length prefix included) and where its parts are."""

    api: int
    version: int
    data: bytes
    sites: tuple[Site, ...]
    batches: tuple[tuple[int, int], ...]  # (start, end) of each record batch in `data`
    body_at: int  # where the body begins, after the header


class _Out:
    """Bytes being written, and every length or count among them."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.sites: list[Site] = []
        self.batches: list[tuple[int, int]] = []

    def raw(self, data: bytes) -> None:
        self.buf += data

    def fixed(self, layout: struct.Struct, value: int, role: str = "") -> None:
        start = len(self.buf)
        self.buf += layout.pack(value)
        if role:
            self.sites.append(Site(start, len(self.buf), f"int{layout.size * 8}", value, role))

    def uvarint(self, value: int, role: str = "", said: int | None = None) -> None:
        start = len(self.buf)
        self.buf += uvarint(value)
        if role:
            shown = value if said is None else said
            self.sites.append(Site(start, len(self.buf), "uvarint", shown, role))

    def length(self, size: int | None, flexible: bool, legacy: struct.Struct, role: str) -> None:
        """A string's, bytes' or array's length or count, None for null."""
        if flexible:
            self.uvarint(0 if size is None else size + 1, role, -1 if size is None else size)
        else:
            self.fixed(legacy, -1 if size is None else size, role)

    def merge(self, other: _Out) -> None:
        shift = len(self.buf)
        self.buf += other.buf
        self.sites += [
            dataclasses.replace(s, start=s.start + shift, end=s.end + shift) for s in other.sites
        ]
        self.batches += [(a + shift, b + shift) for a, b in other.batches]


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def served() -> list[tuple[int, int]]:
    """Every (API, version) the listener serves."""
    return [
        (api, v)
        for api, r in sorted(codec.SUPPORTED.items())
        for v in range(r.min_version, r.max_version + 1)
    ]


class _Spec(NamedTuple):
    """One field of a kio class, as the writer needs it."""

    name: str
    kafka_type: str  # "" for an array or a nested class
    array: bool
    nested: type[Any] | None  # a nested class, else a primitive
    nullable: bool
    tag: int | None


def _fields(cls: Any) -> tuple[_Spec, ...]:
    found = _FIELDS.get(cls)
    if found is None:
        found = _FIELDS[cls] = _read_fields(cls)
    return found


_FIELDS: dict[type, tuple[_Spec, ...]] = {}


def _read_fields(cls: type[Any]) -> tuple[_Spec, ...]:
    hints = typing.get_type_hints(cls)
    specs = []
    for f in dataclasses.fields(cls):
        annotation, nullable = hints[f.name], False
        if typing.get_origin(annotation) in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            nullable, annotation = len(args) < len(typing.get_args(annotation)), args[0]
        array = typing.get_origin(annotation) is tuple
        item = typing.get_args(annotation)[0] if array else annotation
        nested = item if isinstance(item, type) and dataclasses.is_dataclass(item) else None
        kafka_type = f.metadata.get("kafka_type", "")
        specs.append(_Spec(f.name, kafka_type, array, nested, nullable, f.metadata.get("tag")))
    return tuple(specs)


class KafkaRequests:
    """Valid request frames of every served API and version, from one seeded generator."""

    def __init__(self, rng: random.Random, client_id: str = "fuzz") -> None:
        self.rng = rng
        self.client_id = client_id

    def frame(self, api: int, version: int, correlation_id: int) -> KafkaFrame:
        schema = load_request_schema(api, version)
        out = _Out()
        out.fixed(_INT32, 0)  # the frame's length, patched below
        client = self.client_id.encode()
        out.raw(_HEADER.pack(api, version, correlation_id, len(client)))
        out.raw(client)
        if schema.__flexible__:
            out.uvarint(0, "tags")  # the header's tagged fields
        body_at = len(out.buf)
        _Writer(self.rng, api, version).entity(out, schema)
        _INT32.pack_into(out.buf, 0, len(out.buf) - 4)
        return KafkaFrame(
            api, version, bytes(out.buf), tuple(out.sites), tuple(out.batches), body_at
        )

    def any_frame(self, correlation_id: int) -> KafkaFrame:
        api, version = self.rng.choice(served())
        return self.frame(api, version, correlation_id)


class _Writer:
    """One request's fields, written in kio's order with values chosen for each."""

    def __init__(self, rng: random.Random, api: int, version: int) -> None:
        self.rng = rng
        self.api = m.Api(api)
        self.version = version
        # What changes a topic's records or configs names only the run's own topics.
        self.writes = self.api in (
            m.Api.PRODUCE,
            m.Api.CREATE_TOPICS,
            m.Api.DELETE_TOPICS,
            m.Api.DELETE_RECORDS,
            m.Api.INCREMENTAL_ALTER_CONFIGS,
        )

    def entity(self, out: _Out, cls: type[Any]) -> None:
        flexible: bool = cls.__flexible__
        for spec in _fields(cls):
            if spec.tag is None:
                self.field(out, cls, spec, flexible)
        if not flexible:
            return
        present = [s for s in _fields(cls) if s.tag is not None and self.rng.random() < 0.5]
        out.uvarint(len(present), "tags")
        for spec in present:
            inner = _Out()
            self.field(inner, cls, spec, flexible)
            out.uvarint(spec.tag or 0)
            out.uvarint(len(inner.buf), "tag_size")
            out.merge(inner)

    def field(self, out: _Out, owner: type, spec: _Spec, flexible: bool) -> None:
        if spec.array:
            if spec.nullable and self.rng.random() < 0.15:
                out.length(None, flexible, _INT32, "count")
                return
            count = self.count(spec.name)
            out.length(count, flexible, _INT32, "count")
            item = spec._replace(array=False, nullable=False)
            for _ in range(count):
                self.field(out, owner, item, flexible)
            return
        if spec.nested is not None:
            if spec.nullable:
                present = self.rng.random() < 0.8
                out.raw(b"\x01" if present else b"\xff")
                if not present:
                    return
            self.entity(out, spec.nested)
            return
        self.scalar(out, owner, spec, flexible)

    def count(self, name: str) -> int:
        listing = name in ("topics", "topic_data", "partition_data", "partitions")
        if listing and self.rng.random() < 0.8:
            return self.rng.randint(1, 2)
        return self.rng.randint(0, ITEMS_MAX)

    def scalar(self, out: _Out, owner: type, spec: _Spec, flexible: bool) -> None:
        name, kafka_type, nullable = spec.name, spec.kafka_type, spec.nullable
        if kafka_type in _PACK:
            out.fixed(_PACK[kafka_type], self.integer(name, kafka_type))
        elif kafka_type == "bool":
            out.raw(b"\x01" if self.rng.random() < 0.5 else b"\x00")
        elif kafka_type == "uuid":
            out.raw(self.topic_id(nullable).bytes)
        elif kafka_type == "string":
            text = self.text(owner, name, nullable)
            data = None if text is None else text.encode()
            out.length(None if data is None else len(data), flexible, _INT16, "length")
            out.raw(data or b"")
        elif kafka_type in ("bytes", "records"):
            data = self.blob(name, nullable)
            out.length(None if data is None else len(data), flexible, _INT32, "length")
            if data and kafka_type == "records":
                out.batches.append((len(out.buf), len(out.buf) + len(data)))
            out.raw(data or b"")
        else:
            raise AssertionError(f"no fuzz writer for kafka_type {kafka_type!r}")

    # -- values ---------------------------------------------------------------------------------

    def integer(self, name: str, kafka_type: str) -> int:
        rng = self.rng
        lo, hi = _INT_RANGES[kafka_type]
        if rng.random() < 0.05:
            return rng.choice((lo, hi, -1, 0))
        chosen = _NAMED_INTS.get(name)
        if chosen is not None:
            return chosen(self)
        return rng.randint(max(lo, -1), min(hi, 1_000))

    def text(self, owner: type, name: str, nullable: bool) -> str | None:
        rng = self.rng
        if nullable and rng.random() < 0.3:
            return None
        if rng.random() < 0.01:
            return "x" * LONG_TEXT_CHARS  # the longest a legacy string holds
        owner_name = owner.__name__
        if (
            name in ("name", "topic", "topic_names")
            and "Protocol" not in owner_name
            and "Config" not in owner_name
        ):
            return rng.choice(FUZZ_TOPICS if self.writes else READ_TOPICS)
        if name == "resource_name":  # a topic's configs, or a node's
            topics: tuple[str, ...] = FUZZ_TOPICS if self.writes else READ_TOPICS
            return rng.choice((*topics, "1", ""))
        if name == "name" and "Config" in owner_name:
            return rng.choice(
                ("retention.ms", "retention.bytes", "cleanup.policy", "x" * rng.randint(1, 40))
            )
        if name == "value":
            return rng.choice(("1000", "-1", "compact", "not-a-number"))
        if name in ("name", "protocol_name"):
            return rng.choice(PROTOCOLS)
        if name in ("group_id", "groups", "groups_names", "key") or (
            name == "key" and self.api is m.Api.FIND_COORDINATOR
        ):
            return rng.choice(FUZZ_GROUPS)
        if name in ("protocol_type",):
            return rng.choice(("consumer", "connect", ""))
        if name in ("client_software_name", "client_software_version"):
            return rng.choice(("fuzz", "librdkafka", "2.16.0", "a-b.c", "-bad", "a b", ""))
        if name == "states_filter":
            return rng.choice(("Stable", "Empty", "PreparingRebalance", "Dead", "nonsense"))
        if name == "coordinator_keys":
            return rng.choice(FUZZ_GROUPS)
        return rng.choice(("", "m-1", "fuzz", "x" * rng.randint(1, 64), "é\u00e9\u4e2d"))

    def blob(self, name: str, nullable: bool) -> bytes | None:
        rng = self.rng
        if nullable and rng.random() < 0.1:
            return None
        if name == "records":
            return self.batch()
        return rng.randbytes(rng.randint(0, 24))

    def batch(self) -> bytes:
        rng = self.rng
        records = tuple(
            Record(
                rng.choice((None, b"k")), rng.randbytes(rng.randint(0, 40)), 1_700_000_000_000 + i
            )
            for i in range(rng.randint(1, 3))
        )
        if rng.random() < 0.7:
            return encode_batch(-1, -1, -1, records)
        return encode_batch(rng.randint(0, 5_000), rng.randint(0, 3), rng.randint(0, 10), records)

    def topic_id(self, nullable: bool) -> uuid.UUID:
        rng = self.rng
        if rng.random() < 0.3 or (nullable and rng.random() < 0.3):
            return uuid.UUID(int=0)
        return uuid.UUID(int=rng.getrandbits(128))


def _partition(w: _Writer) -> int:
    return w.rng.choice((0, 0, 1, 2, 3, -1, 7))


def _small_wait(w: _Writer) -> int:
    return w.rng.choice((0, 0, 10, 100, 500))


def _session(w: _Writer) -> int:
    return w.rng.choice((6_000, 10_000, 1_000, 0, -1, 1_800_001))


def _rebalance(w: _Writer) -> int:
    return w.rng.choice((1_000, 3_000, 0, -1))


def _created_partitions(w: _Writer) -> int:
    return w.rng.choice((-1, 1, 2, PARTITIONS_CREATED_MAX, 0, -5, 100_000))


_NAMED_INTS: dict[str, Callable[[_Writer], int]] = {
    "partition": _partition,
    "partition_index": _partition,
    "index": _partition,
    "partition_indexes": _partition,
    "partitions": _partition,
    "acks": lambda w: w.rng.choice((-1, -1, 1, 1, 0, 2)),
    "timeout": lambda w: w.rng.choice((5_000, 1_000, 0, 10)),
    "max_wait": _small_wait,
    "min_bytes": lambda w: w.rng.choice((0, 1, 1, 100_000)),
    "max_bytes": lambda w: w.rng.choice((1 << 20, 100, 0, -1)),
    "partition_max_bytes": lambda w: w.rng.choice((1 << 20, 100, 0)),
    "fetch_offset": lambda w: w.rng.choice((0, 0, 5, 100, 1 << 40, -1)),
    "timestamp": lambda w: w.rng.choice((-1, -2, -3, -4, 0, 1_700_000_000_000)),
    "session_timeout": _session,
    "rebalance_timeout": _rebalance,
    "num_partitions": _created_partitions,
    "replication_factor": lambda w: w.rng.choice((-1, 1, 2, 3, 0, 4)),
    "transaction_timeout": lambda w: w.rng.choice((60_000, 0, -1, 900_001)),
    "producer_id": lambda w: w.rng.choice((-1, -1, 0, 1_000)),
    "producer_epoch": lambda w: w.rng.choice((-1, -1, 0, 1)),
    "generation_id": lambda w: w.rng.choice((-1, 0, 1, 2)),
    "key_type": lambda w: w.rng.choice((0, 0, 1, 2, -1)),
    "isolation_level": lambda w: w.rng.choice((0, 1, 2)),
    "replica_id": lambda w: w.rng.choice((-1, -1, 1, 3)),
    "committed_offset": lambda w: w.rng.choice((0, 10, -1, 1 << 40)),
    "retention_time": lambda w: w.rng.choice((-1, 1_000, 0)),
    "endpoint_type": lambda w: w.rng.choice((1, 2, 0, 3)),
}


# -- mutations ------------------------------------------------------------------------------------


def mutate(frame: KafkaFrame, rng: random.Random) -> tuple[str, bytes]:
    """One mutation of `frame`, chosen at random among those that apply: its name, the bytes."""
    kinds: list[Callable[[KafkaFrame, random.Random], bytes]] = [
        _bit_flips,
        _truncation,
        _header_lie,
        _unknown_api,
        _frame_length_lie,
    ]
    if frame.sites:
        kinds += [_length_lie, _length_lie]
    if any(s.encoding == "uvarint" for s in frame.sites):
        kinds.append(_varint_abuse)
    if any(s.role == "tags" for s in frame.sites):
        kinds.append(_tag_abuse)
    if frame.batches:
        kinds += [_damaged_batch, _damaged_batch]
    kind = rng.choice(kinds)
    return kind.__name__.lstrip("_"), kind(frame, rng)


def _framed(body: bytes | bytearray) -> bytes:
    return _INT32.pack(len(body)) + bytes(body)


def _bit_flips(frame: KafkaFrame, rng: random.Random) -> bytes:
    body = bytearray(frame.data[4:])
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(body))
        body[at] ^= 1 << rng.randrange(8)
    return _framed(body)


def _truncation(frame: KafkaFrame, rng: random.Random) -> bytes:
    return _framed(frame.data[4 : rng.randrange(4, len(frame.data))])


def _splice(frame: KafkaFrame, site: Site, encoded: bytes) -> bytes:
    return _framed(frame.data[4 : site.start] + encoded + frame.data[site.end :])


def _length_lie(frame: KafkaFrame, rng: random.Random) -> bytes:
    site = rng.choice(frame.sites)
    lie = rng.choice(
        (site.value + 1, site.value - 1, site.value + 1_000, -1, -2, 0, 2**31 - 1, 2**15 - 1)
    )
    if site.encoding == "uvarint":
        # compact: N+1 on the wire, 0 for null; a tag size or count as it is
        wire = lie + 1 if site.role in ("length", "count") else lie
        return _splice(frame, site, uvarint(max(wire, 0) if rng.random() < 0.9 else 2**32))
    layout = _INT16 if site.encoding == "int16" else _INT32
    lo, hi = -(2 ** (layout.size * 8 - 1)), 2 ** (layout.size * 8 - 1) - 1
    return _splice(frame, site, layout.pack(min(max(lie, lo), hi)))


def _varint_abuse(frame: KafkaFrame, rng: random.Random) -> bytes:
    site = rng.choice([s for s in frame.sites if s.encoding == "uvarint"])
    written = frame.data[site.start : site.end]
    abuse = rng.choice(
        (
            bytes(b | 0x80 for b in written) + b"\x00",  # overlong: the same value, a byte more
            b"\xff" * rng.randint(5, 10),  # never ends, or past 5 bytes
            b"\x80\x80\x80\x80\x10",  # 2^32: past a length
            b"\xff\xff\xff\xff\x0f",
        )
    )
    return _splice(frame, site, abuse)


def _tag_abuse(frame: KafkaFrame, rng: random.Random) -> bytes:
    site = rng.choice([s for s in frame.sites if s.role == "tags"])
    if site.value:  # tags are there: a count that lies about them
        return _splice(frame, site, uvarint(site.value + rng.choice((1, 100, 2**31))))
    tag = rng.choice((0, 1, 7, 99, 2**31 - 1))
    size = rng.randint(0, 8)
    section = rng.choice(
        (
            uvarint(1) + uvarint(tag) + uvarint(size) + rng.randbytes(size),
            uvarint(1) + uvarint(tag) + uvarint(size + 50) + rng.randbytes(size),  # size lies
            uvarint(2) + (uvarint(tag) + uvarint(0)) * 2,  # the same tag twice
            uvarint(2**20) + uvarint(tag),
        )
    )
    return _splice(frame, site, section)


def _header_lie(frame: KafkaFrame, rng: random.Random) -> bytes:
    body = bytearray(frame.data[4:])
    choice = rng.randrange(3)
    if choice == 0:  # the client id's length
        _INT16.pack_into(body, 8, rng.choice((-2, -(2**15), 2**15 - 1, min(len(body), 2**15 - 1))))
    elif choice == 1:  # the correlation id at its edges
        _INT32.pack_into(body, 4, rng.choice((-1, 0, 2**31 - 1, -(2**31))))
    else:  # garbage in the header's place
        body[: min(8, len(body))] = rng.randbytes(min(8, len(body)))
    return _framed(body)


def _unknown_api(frame: KafkaFrame, rng: random.Random) -> bytes:
    body = bytearray(frame.data[4:])
    if rng.random() < 0.5:
        api = rng.choice(
            [
                k
                for k in (-1, 4, 5, 6, 7, 21, 22, 24, 25, 26, 42, 68, 999, 2**15 - 1)
                if k not in codec.SUPPORTED
            ]
        )
        _INT16.pack_into(body, 0, api)
    else:
        supported = codec.SUPPORTED[frame.api]
        _INT16.pack_into(
            body,
            2,
            rng.choice((supported.max_version + 1, supported.min_version - 1, 2**15 - 1, -1)),
        )
    return _framed(body)


def _frame_length_lie(frame: KafkaFrame, rng: random.Random) -> bytes:
    body = frame.data[4:]
    said = rng.choice((len(body) + 1, len(body) + 1_000, max(len(body) - 3, 0), -1, 2**31 - 1, 0))
    return _INT32.pack(said) + body


def _damaged_batch(frame: KafkaFrame, rng: random.Random) -> bytes:
    """A record batch damaged in place, its CRC-32C computed again (most of the time) so that
    the damage gets past the checksum to the checks behind it."""
    start, end = rng.choice(frame.batches)
    batch = bytearray(frame.data[start:end])
    where = rng.choice(
        ("count", "attributes", "magic", "length", "producer", "records", "last_delta")
    )
    if where == "count":
        _INT32.pack_into(batch, 57, rng.choice((0, -1, 2, 10_000, 2**31 - 1)))
    elif where == "attributes":
        _INT16.pack_into(batch, 21, rng.choice((5, 6, 7, 0x10, 0x20, 0x30, 0x08, -1)))
    elif where == "magic":
        batch[16] = rng.choice((0, 1, 3, 255))
    elif where == "length":
        _INT32.pack_into(batch, 8, rng.choice((0, 12, len(batch), len(batch) * 2, -1)))
    elif where == "producer":
        struct.pack_into(
            ">qhi",
            batch,
            43,
            rng.choice((-2, 2**62)),
            rng.choice((-2, 2**15 - 1)),
            rng.choice((-5, 2**31 - 1)),
        )
    elif where == "records" and len(batch) > 61:
        at = rng.randrange(61, len(batch))
        batch[at] = rng.randrange(256)
    else:
        _INT32.pack_into(batch, 23, rng.choice((-1, 100, 2**31 - 1)))
    if rng.random() < 0.9:
        batch[17:21] = crc32c(bytes(batch[21:])).to_bytes(4, "big")
    return frame.data[:start] + bytes(batch) + frame.data[end:]
