"""PartitionStore's recovery on real files: a reopened store has everything, a torn tail is cut
and the log goes on (every way a crash can leave the last frame), frames of the older format
read beside new ones, and damage anywhere else refuses to open.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from cluster.broker.storage import (
    FRAME_HEADER_BYTES,
    StorageCorruptionError,
    StoredBatch,
    segment_file_name,
)
from statemachine.errors import ErrorCode
from tests.component.stores import (
    fill,
    frame_bytes,
    open_store,
    read_all,
    segment_files,
)

# -- reopen and recovery ------------------------------------------------------------------------


def test_reopen_recovers_everything(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        batches = fill(store, 30)
    with open_store(tmp_path) as store:
        assert store.recovered_truncated_bytes == 0
        assert store.recovery_problem is None
        assert (store.log_start_offset, store.next_offset) == (0, 90)
        assert read_all(store) == batches
        assert store.read(47, 0)[0].base_offset == 45
        more = fill(store, 3, first=30)
        assert read_all(store) == batches + more


def test_a_missing_directory_is_created(tmp_path: Path) -> None:
    directory = tmp_path / "a" / "b"
    with open_store(directory) as store:
        assert (store.log_start_offset, store.next_offset, store.size_bytes) == (0, 0, 0)
    assert segment_files(directory) == [directory / segment_file_name(0)]


Damage = Callable[[Path, StoredBatch], int]  # damages the file, returns the bytes to drop


def _cut_half_of_last_frame(path: Path, last: StoredBatch) -> int:
    size = path.stat().st_size
    os.truncate(path, size - frame_bytes(last) // 2)
    return frame_bytes(last) - frame_bytes(last) // 2


def _flip_last_byte(path: Path, last: StoredBatch) -> int:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    return frame_bytes(last)


def _flip_header_byte(path: Path, last: StoredBatch) -> int:
    data = bytearray(path.read_bytes())
    data[len(data) - frame_bytes(last) + 20] ^= 0x40  # inside append_time_ms
    path.write_bytes(bytes(data))
    return frame_bytes(last)


def _flip_leader_epoch(path: Path, last: StoredBatch) -> int:
    data = bytearray(path.read_bytes())
    # The batch's partition leader epoch: outside the batch's own CRC, inside the frame's.
    data[len(data) - frame_bytes(last) + FRAME_HEADER_BYTES + 13] ^= 0x01
    path.write_bytes(bytes(data))
    return frame_bytes(last)


def _clear_frame_kind(path: Path, last: StoredBatch) -> int:
    data = bytearray(path.read_bytes())
    data[len(data) - frame_bytes(last)] &= 0x7F  # HEAD_CHECKED off: read as a format-2 frame
    path.write_bytes(bytes(data))
    return frame_bytes(last)


def _shorten_frame_length(path: Path, last: StoredBatch) -> int:
    data = bytearray(path.read_bytes())
    at = len(data) - frame_bytes(last)
    length = int.from_bytes(data[at : at + 4], "big")
    data[at : at + 4] = (length - 4).to_bytes(4, "big")  # under no CRC but the batch's length
    path.write_bytes(bytes(data))
    return frame_bytes(last)


def _append_garbage(path: Path, last: StoredBatch) -> int:
    with path.open("ab") as f:
        f.write(b"\x00" * 100)  # blocks allocated but never written, as after a crash
    return 100


@pytest.mark.parametrize(
    ("damage", "lost_last"),
    [
        (_cut_half_of_last_frame, True),
        (_flip_last_byte, True),
        (_flip_header_byte, True),
        (_flip_leader_epoch, True),
        (_clear_frame_kind, True),
        (_shorten_frame_length, True),
        (_append_garbage, False),
    ],
)
def test_a_torn_tail_is_truncated_and_the_log_goes_on(
    tmp_path: Path, damage: Damage, lost_last: bool
) -> None:
    with open_store(tmp_path) as store:
        batches = fill(store, 13)
    last = batches[-1]
    active = segment_files(tmp_path)[-1]
    assert int(active.stem) <= last.base_offset
    dropped = damage(active, last)

    with open_store(tmp_path) as store:
        assert store.recovered_truncated_bytes == dropped
        assert store.recovery_problem is not None
        kept = batches[:-1] if lost_last else batches
        assert store.next_offset == kept[-1].next_offset
        assert read_all(store) == kept
        assert store.read(last.base_offset, 100) == ([] if lost_last else [last])
        again = fill(store, 2, first=len(kept))
        assert again[0].base_offset == kept[-1].next_offset
    with open_store(tmp_path) as store:
        assert store.recovered_truncated_bytes == 0
        assert read_all(store) == kept + again


def format_2_frame(batch: StoredBatch) -> bytes:
    """A frame as data format 2 wrote it: zlib's CRC-32 over all of it after the crc field."""
    tail = struct.pack(">qiq", batch.base_offset, batch.record_count, batch.append_time_ms)
    crc = zlib.crc32(tail + batch.batch)
    return struct.pack(">II", len(batch.batch), crc) + tail + batch.batch


def test_frames_of_format_2_are_read_and_recovered_beside_new_ones(tmp_path: Path) -> None:
    with open_store(tmp_path, segment_bytes_max=1 << 20) as store:
        old = fill(store, 4)
    (active,) = segment_files(tmp_path)
    active.write_bytes(b"".join(format_2_frame(b) for b in old))  # as format 2 left it
    with open_store(tmp_path, segment_bytes_max=1 << 20) as store:
        assert (store.recovered_truncated_bytes, store.recovery_problem) == (0, None)
        assert read_all(store) == old
        new = fill(store, 2, first=4)
    with open_store(tmp_path, segment_bytes_max=1 << 20) as store:
        assert (store.recovered_truncated_bytes, store.recovery_problem) == (0, None)
        assert read_all(store) == old + new
    data = bytearray(active.read_bytes())
    data[frame_bytes(old[0]) - 1] ^= 0x01  # the first (format 2) frame's last byte
    active.write_bytes(bytes(data))
    with open_store(tmp_path, segment_bytes_max=1 << 20) as store:
        assert store.recovery_problem is not None
        assert "CRC" in store.recovery_problem
        assert read_all(store) == []


def test_damage_in_a_sealed_segment_refuses_to_open(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        fill(store, 20)
    first = segment_files(tmp_path)[0]
    data = bytearray(first.read_bytes())
    data[0] = 0xFF  # the length of the first frame: now far past the end of the file
    first.write_bytes(bytes(data))
    with pytest.raises(StorageCorruptionError, match=r"00000000000000000000\.log") as info:
        open_store(tmp_path)
    assert info.value.error == ErrorCode.CORRUPT_MESSAGE  # as Kafka answers for bad records


def test_a_missing_middle_segment_refuses_to_open(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        fill(store, 20)
    segment_files(tmp_path)[2].unlink()
    with pytest.raises(StorageCorruptionError, match="next segment starts"):
        open_store(tmp_path)
