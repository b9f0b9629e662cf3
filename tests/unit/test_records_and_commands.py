"""The encodings at the edge of the state machines: record batches and commands."""

from __future__ import annotations

import msgpack
import pytest
from crc32c import crc32c

from statemachine.codec import CodecError, pack
from statemachine.commands import (
    COMMAND_TYPES,
    AppendBatch,
    AppendFencedBatch,
    CommandDecodeError,
    CreateTopic,
    InitTransactionalProducer,
    decode_command,
    encode_append,
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
    with_base_offset,
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


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (Record("key", b"v", 1), "key and value"),  # type: ignore[arg-type]
        (Record(None, 7, 1), "key and value"),  # type: ignore[arg-type]
        (Record(None, b"v", -1), "timestamp"),
        (Record(None, b"v", True), "timestamp"),
        (Record(None, b"v", 2**63), "timestamp"),
        (Record(None, b"v", 1, [("h", b"x")]), "bounded tuple"),  # type: ignore[arg-type]
        (Record(None, b"v", 1, (("h", "x"),)), "header is"),  # type: ignore[arg-type]
        (Record(None, b"v", 1, ((b"h", b"x"),)), "header is"),  # type: ignore[arg-type]
        (Record(None, b"v", 1, (("\ud800", b"x"),)), "UTF-8"),
    ],
)
def test_invalid_records_are_refused_by_name(record: Record, message: str) -> None:
    # The encoder's checks at once for the common record must leave every other to
    # `_check_record`: each of these is refused as a BatchFormatError saying why.
    for records in ((record,), (Record(None, b"first", 1), record)):
        with pytest.raises(BatchFormatError, match=message):
            RecordBatch(1, 0, 0, records).encode()


def test_empty_batch_and_short_bytes_are_refused() -> None:
    with pytest.raises(BatchFormatError):
        RecordBatch(1, 0, 0, ()).encode()
    with pytest.raises(BatchFormatError, match="shorter"):
        read_header(b"\x01" * (HEADER_BYTES - 1))


def test_oversize_batch_is_refused_by_the_limit() -> None:
    data = batch(1, 0, 0, 20)
    with pytest.raises(BatchFormatError, match="exceeds"):
        read_header(data, StateLimits(batch_bytes_max=len(data) - 1, entry_bytes_max=10**6))


def _recrc(data: bytearray) -> bytes:
    data[17:21] = crc32c(bytes(data[21:])).to_bytes(4, "big")
    return bytes(data)


@pytest.mark.parametrize(
    ("offset", "value", "message"),
    [
        (57, (4).to_bytes(4, "big"), "count"),  # record_count 4, last_offset_delta says 3
        (23, (5).to_bytes(4, "big"), "count"),  # last_offset_delta 5, record_count says 3
        (21, (0x30).to_bytes(2, "big"), "control"),  # markers are the broker's to write
        (21, (0x05).to_bytes(2, "big"), "attributes"),  # compression codec 5 does not exist
        (21, (0x08).to_bytes(2, "big"), "attributes"),  # LogAppendTime: a broker's choice
        (16, b"\x01", "magic"),
    ],
)
def test_a_header_that_lies_is_refused_at_the_edge(offset: int, value: bytes, message: str) -> None:
    """What Kafka's broker checks of a v2 batch, with a CRC that matches the lie."""
    forged = bytearray(batch(1, 0, 0, 3))
    forged[offset : offset + len(value)] = value
    with pytest.raises(BatchFormatError, match=message):
        verify_batch(_recrc(forged))


def test_a_length_that_lies_is_refused() -> None:
    data = bytearray(batch(1, 0, 0, 2))
    data[8:12] = (len(data) - 11).to_bytes(4, "big")
    with pytest.raises(BatchFormatError, match="length"):
        read_header(bytes(data))


def test_records_that_lie_behind_a_good_crc_are_refused_by_readers() -> None:
    """The edge reads no record (its cost per batch must not grow with them); a reader checks
    every record's framing and refuses the batch."""
    data = bytearray(batch(1, 0, 0, 2))
    data[HEADER_BYTES] = 0x7E  # the first record's length: 63, past its bytes
    forged = _recrc(data)
    verify_batch(forged)
    with pytest.raises(BatchFormatError, match="record"):
        decode_records(forged)


def test_a_base_offset_is_set_without_touching_the_crc() -> None:
    data = batch(1, 0, 0, 2)
    moved = with_base_offset(data, 1_234_567)
    assert int.from_bytes(moved[:8], "big") == 1_234_567  # its base offset
    assert verify_batch(moved) == verify_batch(data)
    assert moved[8:] == data[8:]


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


@pytest.mark.parametrize("fence", [None, ("sink", 3, 17, 2)])
def test_an_append_encoded_from_a_view_is_the_command_s_own_encoding(
    fence: tuple[str, int, int, int] | None,
) -> None:
    batch = RecordBatch(7, 0, 0, (Record(b"k", b"v", 1_000),)).encode()
    command = AppendBatch(5, batch) if fence is None else AppendFencedBatch(5, batch, *fence)
    request = b"head" + batch + b"tail"  # the batch as a Kafka Produce's request holds it
    view = memoryview(request)[4 : 4 + len(batch)]
    assert encode_append(5, view, fence) == encode_append(5, batch, fence) == command.encode()
    assert decode_command(encode_append(5, view, fence)) == command
