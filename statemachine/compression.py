"""Decompression of a batch's records: every codec Kafka's clients write (gzip, snappy in both
of its framings, lz4, zstd), through cramjam, its output bounded so that a small compressed
batch cannot inflate past `decompressed_batch_bytes_max` (a decompression bomb stops there).
"""

from __future__ import annotations

from typing import Any

import cramjam

from statemachine.limits import KIB

COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD = range(5)
COMPRESSION_NAMES = ("none", "gzip", "snappy", "lz4", "zstd")


class CompressionError(ValueError):
    """Records that do not decompress, or not within the bound."""


_SNAPPY_XERIAL = b"\x82SNAPPY\x00"  # the Java client's framed snappy (xerial's stream format)


def decompressed(body: memoryview, codec: int, bound: int) -> bytes:
    """A batch's records as `codec` (its attributes' low three bits) compressed them, at most
    `bound` bytes of them (CompressionError beyond, or if they do not decompress)."""
    if codec == COMPRESSION_NONE:
        return bytes(body)
    try:
        if codec == COMPRESSION_SNAPPY:
            return _snappy(body, bound)
        return _bounded(getattr(cramjam, COMPRESSION_NAMES[codec]), body, bound)
    except CompressionError:
        raise
    except Exception as exc:  # cramjam's errors name no common class
        raise CompressionError(
            f"{COMPRESSION_NAMES[codec]} records do not decompress within {bound} bytes"
        ) from exc


def _bounded(module: Any, body: memoryview, bound: int) -> bytes:
    """Decompress into a buffer that grows by 4x up to `bound`: a small batch never
    allocates the bound, and a bomb stops there."""
    size = min(bound, max(64 * KIB, 8 * len(body)))
    while True:
        out = bytearray(size)
        try:
            written = module.decompress_into(body, out)
        except Exception:
            if size >= bound:
                raise
            size = min(bound, size * 4)
            continue
        return bytes(out[:written])


def _snappy(body: memoryview, bound: int) -> bytes:
    """Raw snappy (librdkafka), or xerial's framing (the Java client): a 16-byte head, then
    blocks each a 4-byte length and raw snappy. Each block states its output length."""
    if bytes(body[:8]) != _SNAPPY_XERIAL:
        return bytes(cramjam.snappy.decompress_raw(_check_snappy_len(body, bound)))
    out, position = bytearray(), 16
    while position < len(body):
        length = int.from_bytes(body[position : position + 4], "big")
        position += 4
        if length <= 0 or position + length > len(body):
            raise CompressionError("snappy (xerial) block length is out of range")
        block = body[position : position + length]
        out += cramjam.snappy.decompress_raw(_check_snappy_len(block, bound - len(out)))
        position += length
    return bytes(out)


def _check_snappy_len(block: memoryview, bound: int) -> memoryview:
    if cramjam.snappy.decompress_raw_len(block) > bound:
        raise CompressionError(f"snappy records exceed {bound} bytes")
    return block
