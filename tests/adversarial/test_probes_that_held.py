"""Probes that the native listener already withstands, kept so they keep holding.

Each sends what no client would (random bytes, an oversize length prefix, a msgpack bomb,
malformed record batches, hostile topic names and sizes), expects the node to refuse it with an
error or drop the connection, and ends with `assert_intact`.
"""

from __future__ import annotations

import random
import struct
import zlib

import msgpack
import pytest

from cluster import native as p
from cluster.client import Client
from statemachine.errors import ErrorCode
from tests.adversarial.conftest import (
    KNOWN_TOPIC,
    Known,
    assert_intact,
    exchange,
    frame,
    leaders,
    open_raw,
    read_answer,
    send_and_drain,
)

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def test_random_bytes_are_refused(known: Known) -> None:
    rng = random.Random(19)
    address = known.cluster.nodes[0].client_address
    for _ in range(5):
        await send_and_drain(address, rng.randbytes(rng.randrange(1, 4096)))
    await assert_intact(known)


async def test_a_4_gib_length_prefix_is_refused(known: Known) -> None:
    address = known.cluster.nodes[1].client_address
    await send_and_drain(address, (0xFFFF_FFF0).to_bytes(4, "big") + b"x" * 1024)
    await assert_intact(known)


async def test_a_msgpack_bomb_is_refused(known: Known) -> None:
    # A msgpack array header claiming 2^32-1 elements, then nothing: a decoder that trusts it
    # would allocate for four billion items.
    address = known.cluster.nodes[2].client_address
    await send_and_drain(address, frame(b"\xdd\xff\xff\xff\xff"))
    await assert_intact(known)


# -- malformed batches ---------------------------------------------------------------------------

_HEADER = struct.Struct(">BIhqhiiq")  # statemachine/records.py's layout, spelled out: the test
# must not trust the code it probes to build its hostile bytes


def _batch(
    *,
    magic: int = 1,
    attributes: int = 0,
    producer_id: int = -1,
    epoch: int = -1,
    sequence: int = -1,
    count: int = 1,
    max_timestamp_ms: int = 1_000,
    body: bytes | None = None,
    crc: int | None = None,
) -> bytes:
    """A batch with every header field and the body chosen, its CRC right unless given."""
    if body is None:  # as many records as the count says, within reason (2^31-1 is not)
        body = msgpack.packb([[max_timestamp_ms, None, b"hostile", []]] * min(max(count, 1), 16))
    covered = (
        _HEADER.pack(magic, 0, attributes, producer_id, epoch, sequence, count, max_timestamp_ms)[
            5:
        ]
        + body
    )
    if crc is None:
        crc = zlib.crc32(covered)
    return bytes([magic]) + crc.to_bytes(4, "big") + covered


MALFORMED_BATCHES = {
    "empty": b"",
    "shorter than its header": _batch()[:20],
    "unknown magic": _batch(magic=2),
    "wrong crc": _batch(crc=0xDEADBEEF),
    "unknown attributes (compression)": _batch(attributes=1),
    "no records": _batch(count=0, body=msgpack.packb([])),
    "negative record count": _batch(count=-5),
    "count larger than its records": _batch(count=5, body=msgpack.packb([[1_000, None, b"x", []]])),
    "count of 2^31-1": _batch(count=2**31 - 1),
    "negative timestamp": _batch(max_timestamp_ms=-1),
    "max timestamp disagrees": _batch(
        max_timestamp_ms=5, body=msgpack.packb([[9, None, b"x", []]])
    ),
    "producer id -2": _batch(producer_id=-2, epoch=0, sequence=0),
    "sequence without producer": _batch(sequence=0),
    "negative epoch": _batch(producer_id=7, epoch=-5, sequence=0),
    "negative sequence": _batch(producer_id=7, epoch=0, sequence=-3),
    "body is not msgpack": _batch(body=b"\xc1\xc1\xc1"),
    "body is a msgpack bomb": _batch(body=b"\xdd\xff\xff\xff\xff"),
    "a record of the wrong shape": _batch(body=msgpack.packb([[1_000, None]])),
    "a value that is an int": _batch(body=msgpack.packb([[1_000, None, 5, []]])),
    "a header value that is a str": _batch(body=msgpack.packb([[1_000, None, b"x", [["h", "s"]]]])),
    "trailing bytes after the body": _batch() + b"\x00" * 16,
}


async def test_malformed_batches_are_refused_and_nothing_reaches_the_log(
    known: Known, client: Client
) -> None:
    """Every variant gets a per-batch error on the partition's leader; `assert_intact` then
    finds nothing but the known records in the topic."""
    leader = (await leaders(client, KNOWN_TOPIC))[0]
    names = list(MALFORMED_BATCHES)
    entries = tuple(p.ProduceEntry(KNOWN_TOPIC, 0, MALFORMED_BATCHES[n]) for n in names)
    answers = await exchange(leader, [p.Produce(5_000, (entry,)) for entry in entries])
    for name, answer in zip(names, answers, strict=True):
        assert isinstance(answer, p.ProduceResponse), (name, answer)
        (result,) = answer.results
        assert result.error in {ErrorCode.CORRUPT_MESSAGE, ErrorCode.INVALID_RECORD}, (
            name,
            ErrorCode(result.error),
        )
        assert result.base_offset == -1, name
    await assert_intact(known)


# -- hostile topic names and sizes ---------------------------------------------------------------

HOSTILE_NAMES = [
    "",
    ".",
    "..",
    "a/b",
    "../../etc",
    "a\\b",
    "a\x00b",
    "caf\u00e9",
    " ",
    "a b",
    "topic\n",
    "x" * 250,
    "\U0001f4a3",
]
HOSTILE_SIZES = [  # (partitions, replication factor, retention ms, retention bytes)
    (0, 1, -1, -1),
    (1_000_000, 1, -1, -1),
    (1, 0, -1, -1),
    (1, 4, -1, -1),
    (1, 1, -2, -1),
    (1, 1, -1, -2),
]


def create_topic_frame(name: str, sizes: tuple[int, int, int, int] = (1, 1, -1, -1)) -> bytes:
    """A CreateTopic frame written by hand: the protocol's encoder would refuse some of these."""
    return frame(msgpack.packb([p.PROTOCOL_VERSION, 1, int(p.Op.CREATE_TOPIC), [name, *sizes]]))


async def test_hostile_topic_names_and_sizes_are_refused(known: Known, client: Client) -> None:
    address = known.cluster.nodes[0].client_address
    requests = [create_topic_frame(n) for n in HOSTILE_NAMES] + [
        create_topic_frame(f"hostile-size-{i}", s) for i, s in enumerate(HOSTILE_SIZES)
    ]
    reader, writer = await open_raw(address)
    try:
        writer.write(b"".join(requests))  # pipelined: each is answered, in order
        await writer.drain()
        for request in requests:
            _, answer = await read_answer(reader, p.CreateTopic)
            assert isinstance(answer, p.ErrorResponse), (request[:40], answer)
    finally:
        writer.close()
    response = await client.refresh()  # every topic
    created = {t.name for t in response.topics}
    assert not created & set(HOSTILE_NAMES)
    assert not any(name.startswith("hostile-size-") for name in created)
    await assert_intact(known)
