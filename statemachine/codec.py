"""msgpack with explicit options: the one msgpack user inside `statemachine/`.

Commands, record bodies and snapshots are encoded here so every replica produces and accepts
exactly the same bytes. Decoding is strict: no ext types, string-only map keys, no trailing
bytes, and a bound on the input size; any failure is a `CodecError`, never another exception.
"""

from __future__ import annotations

from typing import Any, NoReturn

import msgpack


class CodecError(ValueError):
    """Bytes that are not a well-formed value of the expected shape."""


class SnapshotError(CodecError):
    """A snapshot that does not decode to the state it claims to hold."""


def _no_ext(code: int, _data: bytes) -> NoReturn:
    raise CodecError(f"msgpack ext type {code} is not allowed")


# One packer, reused: `msgpack.packb` builds a Packer on every call, which is two thirds of
# its cost for the small values of the write path. Sharing it is safe: `pack` is one C call
# that runs no Python code for the plain types given here (so no other thread can enter it
# meanwhile) and empties its buffer when it fails.
_PACKER = msgpack.Packer(use_bin_type=True, datetime=False)
# A tuple, built once: `bytes | bytearray | memoryview` written inside isinstance() builds two
# UnionType objects on every call (~100 ns, a third of unpack's overhead).
_BINARY_TYPES = (bytes, bytearray, memoryview)


def pack(value: object) -> bytes:
    """Encode plain data (None, bool, int, str, bytes, lists/tuples, str-keyed dicts)."""
    try:
        packed: bytes = _PACKER.pack(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise CodecError(f"cannot encode: {exc}") from exc
    return packed


def unpack(data: bytes | memoryview, *, size_max: int) -> object:
    """Decode exactly one value from `data`; lists come back as tuples."""
    if not isinstance(data, _BINARY_TYPES):
        raise CodecError(f"expected bytes, got {type(data).__name__}")
    if len(data) > size_max:
        raise CodecError(f"{len(data)} bytes exceed the limit of {size_max}")
    try:
        value = msgpack.unpackb(
            data,
            raw=False,
            use_list=False,
            strict_map_key=True,
            ext_hook=_no_ext,
        )
    except CodecError:
        raise
    except (ValueError, TypeError, OverflowError, msgpack.UnpackException) as exc:
        raise CodecError(f"malformed msgpack: {exc}") from exc
    # msgpack decodes ext type -1 (Timestamp) itself, without asking ext_hook. At the top level
    # it is refused here; nested, it fails the type checks of every caller, which accept only
    # None, bool, int, str, bytes and tuples.
    if type(value) is msgpack.Timestamp:
        raise CodecError("msgpack ext type -1 (Timestamp) is not allowed")
    return value


def unpack_snapshot(data: bytes, version: int, arity: int, what: str) -> tuple[Any, ...]:
    """Decode a snapshot `[version, *fields]`, checking its version and field count."""
    return unpack_versioned_snapshot(data, {version: arity}, what)[1]


def unpack_versioned_snapshot(
    data: bytes, arities: dict[int, int], what: str
) -> tuple[int, tuple[Any, ...]]:
    """Decode a snapshot `[version, *fields]` of any version in `arities` (version -> its
    field count): its version and fields, so that a reader keeps reading older snapshots."""
    try:
        raw = unpack(data, size_max=len(data))
    except CodecError as exc:
        raise SnapshotError(f"{what} snapshot: {exc}") from exc
    if not isinstance(raw, tuple) or not raw:
        raise SnapshotError(f"{what} snapshot: expected [version, ...]")
    version = raw[0]
    if type(version) is not int or version not in arities:
        raise SnapshotError(f"{what} snapshot: version {version!r} is not {sorted(arities)}")
    if len(raw) != arities[version] + 1:
        raise SnapshotError(f"{what} snapshot: expected [{version}, {arities[version]} fields]")
    return version, raw[1:]


def expect_int(value: object, what: str) -> int:
    """An integer field of a snapshot, or SnapshotError."""
    if type(value) is not int:
        raise SnapshotError(f"{what}: expected an integer, got {type(value).__name__}")
    return value
