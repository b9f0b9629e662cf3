"""The encodings at the edge of the state machines: record batches and commands."""

from __future__ import annotations

import zlib

import msgpack
import pytest

from statemachine.codec import CodecError, pack
from statemachine.commands import (
    COMMAND_TYPES,
    AppendBatch,
    CommandDecodeError,
    CreateTopic,
    InitTransactionalProducer,
    decode_command,
)
from statemachine.limits import StateLimits
from statemachine.records import (
    HEADER_BYTES,
    BatchFormatError,
    Record,
    RecordBatch,
    decode_records,
    read_header,
    verify_batch,
)
from tests.builders import batch


def test_batch_round_trip_keeps_every_field() -> None:
    original = RecordBatch(
        42,
        3,
        100,
        (
            Record(b"k", b"v", 10, (("trace", b"\x00\x01"),)),
            Record(None, None, 30),
            Record(b"", b"", 20, (("a", b""), ("a", b"dup-key-allowed"))),
        ),
    )
    data = original.encode()
    assert RecordBatch.decode(data) == original
    header = read_header(data)
    assert (header.record_count, header.max_timestamp_ms, header.last_sequence) == (3, 30, 102)
    assert decode_records(data) == original.records


def test_a_failed_pack_leaves_nothing_behind_for_the_next() -> None:
    # pack() reuses one msgpack Packer: what a failure had written must not lead the next value.
    for unencodable in ([1, "ok", object()], ["\udcff"], [b"x" * 100, {1: 2, "k": object()}]):
        with pytest.raises(CodecError):
            pack(unencodable)
        assert pack([7, "after"]) == msgpack.packb([7, "after"], use_bin_type=True)


def test_crc_detects_a_flipped_body_byte() -> None:
    data = bytearray(batch(1, 0, 0, 3))
    data[-1] ^= 0x01
    read_header(bytes(data))  # apply's path reads only the header ...
    with pytest.raises(BatchFormatError, match="CRC"):
        verify_batch(bytes(data))  # ... the leader's edge check catches the corruption


@pytest.mark.parametrize(
    ("batch_args", "message"),
    [
        ((-5, 0, 0), "producer id"),
        ((1, -1, 0), "epoch"),
        ((1, 0, -1), "sequence"),
        ((-1, 0, 0), "epoch and sequence -1"),
    ],
)
def test_invalid_headers_are_refused(batch_args: tuple[int, int, int], message: str) -> None:
    with pytest.raises(BatchFormatError, match=message):
        RecordBatch(*batch_args, (Record(None, b"v", 1),)).encode()


def test_empty_batch_and_short_bytes_are_refused() -> None:
    with pytest.raises(BatchFormatError):
        RecordBatch(1, 0, 0, ()).encode()
    with pytest.raises(BatchFormatError, match="shorter"):
        read_header(b"\x01" * (HEADER_BYTES - 1))


def test_oversize_batch_is_refused_by_the_limit() -> None:
    data = batch(1, 0, 0, 20)
    with pytest.raises(BatchFormatError, match="exceeds"):
        read_header(data, StateLimits(batch_bytes_max=len(data) - 1, entry_bytes_max=10**6))


def test_body_that_disagrees_with_the_header_is_refused() -> None:
    good = batch(1, 0, 0, 2)
    body = msgpack.packb([[1, None, b"v", []]])
    forged = bytearray(good[:HEADER_BYTES] + body)
    forged[1:5] = zlib.crc32(bytes(forged[5:])).to_bytes(4, "big")
    with pytest.raises(BatchFormatError, match="count"):
        verify_batch(bytes(forged))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",  # never-used msgpack byte
        msgpack.packb([99, 1]),  # unknown tag
        msgpack.packb([1, 2, 0, b""]),  # unknown version
        msgpack.packb([1, 1, 0]),  # missing field
        msgpack.packb([1, 1, -1, b""]),  # negative time
        msgpack.packb([1, 1, True, b""]),  # bool is not an int
        msgpack.packb([1, 1, 0, "text"]),  # str where bytes belong
        msgpack.packb({"tag": 1}),  # not an array
        msgpack.packb([1, 1, 0, b""]) + b"\x00",  # trailing bytes
        msgpack.packb(msgpack.ExtType(1, b"x")),  # ext types are refused
    ],
)
def test_malformed_commands_raise_decode_errors_only(data: bytes) -> None:
    with pytest.raises(CommandDecodeError):
        decode_command(data)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ([1, 1, True, b""], r"^AppendBatch\.now_ms: expected an integer in \[0, "),
        ([1, 1, 0, "text"], r"^AppendBatch\.batch: expected bytes$"),
        ([4, 1, 0, b"", b"sink", 0, 0, 0], r"^AppendFencedBatch\.sink: expected a string$"),
    ],
)
def test_a_refused_field_is_named_with_the_reason_of_its_rule(
    fields: list[object], message: str
) -> None:
    """The rules are statemachine/fields.py's, shared with the client wire: the same reasons."""
    with pytest.raises(CommandDecodeError, match=message):
        decode_command(msgpack.packb(fields))


def test_oversize_entry_is_refused_before_decoding() -> None:
    entry = AppendBatch(1, b"x" * 2_000).encode()
    with pytest.raises(CommandDecodeError, match="exceed"):
        decode_command(entry, StateLimits(entry_bytes_max=1_500, batch_bytes_max=400))


def test_every_command_has_a_unique_tag_and_round_trips() -> None:
    assert len({c.TAG for c in COMMAND_TYPES}) == len(COMMAND_TYPES)
    for command in [
        CreateTopic("orders", 3, 3, -1, 1 << 30),
        InitTransactionalProducer("tx", 60_000, -1, -1, 123),
        AppendBatch(5, batch(1, 0, 0)),
    ]:
        assert decode_command(command.encode()) == command


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="positive"):
        StateLimits(topics_max=0)
    with pytest.raises(ValueError, match="entry_bytes_max"):
        StateLimits(batch_bytes_max=StateLimits().entry_bytes_max)
