"""The Raft journal's files (cluster/raft/journal.py): what survives a reopen, and what a
torn or damaged file is taken for.

Every damage a crash or a disk can do to the log is cut at the first record it touches, never
read as an entry: a tail cut at each of its bytes, a flipped bit in each field of a record, a
record that does not follow its predecessor. The meta file (term, vote, commit index) is never
guessed: a cut or flipped one is refused.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cluster.raft import journal as j
from cluster.raft.adapter import parse_dump
from statemachine.codec import CodecError

ENTRIES = [(b"\x00" + bytes([i]) * (i * 7), i + 1, 1 + i // 3) for i in range(12)]


def written(directory: Path, entries: list[j.Entry] = ENTRIES) -> j.JournalFile:
    f = j.JournalFile(directory, durable=False)
    for entry in entries:
        f.append(*entry)
    return f


def reopened(directory: Path) -> j.JournalFile:
    return j.JournalFile(directory, durable=False)


def record_offsets(directory: Path) -> list[int]:
    """Where each record of the log file starts, and its end."""
    data = (directory / j.LOG_NAME).read_bytes()
    offsets = [len(j.MAGIC)]
    while offsets[-1] < len(data):
        (length,) = j._CRC.unpack_from(data, offsets[-1])
        offsets.append(offsets[-1] + 8 + length)
    return offsets


def test_entries_survive_a_reopen(tmp_path: Path) -> None:
    written(tmp_path).close()
    f = reopened(tmp_path)
    assert f.entries == ENTRIES
    assert f.dropped_bytes == 0
    f.append(b"\x00next", 13, 5)  # and appending goes on after the last
    f.close()
    assert reopened(tmp_path).entries == [*ENTRIES, (b"\x00next", 13, 5)]


def test_a_torn_tail_is_cut_at_each_of_its_bytes(tmp_path: Path) -> None:
    written(tmp_path).close()
    path = tmp_path / j.LOG_NAME
    whole = path.read_bytes()
    last_start = record_offsets(tmp_path)[-2]
    for cut in range(last_start, len(whole)):
        path.write_bytes(whole[:cut])
        f = reopened(tmp_path)
        assert f.entries == ENTRIES[:-1], cut
        assert f.dropped_bytes == cut - last_start
        f.close()
        assert path.stat().st_size == last_start, "the torn bytes are cut off the file"


@pytest.mark.parametrize("field", ["length", "crc", "index", "term", "command"])
def test_a_flipped_bit_ends_the_log_at_its_record(tmp_path: Path, field: str) -> None:
    written(tmp_path).close()
    path = tmp_path / j.LOG_NAME
    offsets = record_offsets(tmp_path)
    victim = 7
    at = offsets[victim] + {"length": 3, "crc": 5, "index": 15, "term": 23, "command": 26}[field]
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    path.write_bytes(bytes(data))
    f = reopened(tmp_path)
    assert f.entries == ENTRIES[:victim]
    assert f.dropped_bytes == len(data) - offsets[victim]


def test_a_record_out_of_order_ends_the_log(tmp_path: Path) -> None:
    written(tmp_path).close()
    path = tmp_path / j.LOG_NAME
    # A well-formed record, its CRC right, that does not follow the last index.
    stray = j._record_head(b"\x00stray", 40, 1) + b"\x00stray"
    path.write_bytes(path.read_bytes() + stray)
    assert reopened(tmp_path).entries == ENTRIES


def test_a_file_that_is_not_a_journal_is_refused(tmp_path: Path) -> None:
    (tmp_path / j.LOG_NAME).write_bytes(b"PYSYNCOBJ\x00" * 8)
    with pytest.raises(j.JournalError, match="not a raftbroker journal"):
        reopened(tmp_path)


def test_a_cut_tail_and_a_rewrite_are_what_a_reopen_finds(tmp_path: Path) -> None:
    f = written(tmp_path)
    f.truncate_from(9)
    f.append(b"\x00other", 10, 4)
    f.close()
    assert reopened(tmp_path).entries == [*ENTRIES[:9], (b"\x00other", 10, 4)]
    f = reopened(tmp_path)
    f.rewrite(ENTRIES[5:9])
    f.append(b"\x00after", 10, 4)
    f.close()
    assert reopened(tmp_path).entries == [*ENTRIES[5:9], (b"\x00after", 10, 4)]


def test_a_rewrite_cut_short_by_a_crash_leaves_the_old_log(tmp_path: Path) -> None:
    written(tmp_path).close()
    # What a crash in the middle of a rewrite leaves: the new file, never renamed.
    (tmp_path / (j.LOG_NAME + ".tmp")).write_bytes(j.MAGIC + b"\x00\x00\x00")
    assert reopened(tmp_path).entries == ENTRIES


def test_sync_syncs_once_per_batch_of_writes_and_only_when_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real = os.fdatasync

    def counted(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counted)
    (tmp_path / "d").mkdir()
    (tmp_path / "r").mkdir()
    durable = j.JournalFile(tmp_path / "d", durable=True)
    before = len(synced)
    for entry in ENTRIES:
        durable.append(*entry)
    assert len(synced) == before, "an append does not sync by itself"
    durable.sync()
    durable.sync()  # nothing new: no second sync
    assert len(synced) == before + 1
    relaxed = j.JournalFile(tmp_path / "r", durable=False)
    relaxed.append(*ENTRIES[0])
    relaxed.sync()
    assert len(synced) == before + 1


# -- the meta file -------------------------------------------------------------------------------


def test_meta_survives_a_reopen(tmp_path: Path) -> None:
    f = written(tmp_path)
    assert f.meta == j.NO_META
    f.store_meta(j.Meta(7, "127.0.0.3:19092", 42))
    f.close()
    assert reopened(tmp_path).meta == j.Meta(7, "127.0.0.3:19092", 42)
    f = reopened(tmp_path)
    f.store_meta(j.Meta(8, None, 42))
    assert reopened(tmp_path).meta == j.Meta(8, None, 42)


def test_every_damage_to_the_meta_file_is_refused(tmp_path: Path) -> None:
    j.write_meta(tmp_path / j.META_NAME, j.Meta(7, "127.0.0.3:19092", 42), durable=False)
    whole = (tmp_path / j.META_NAME).read_bytes()
    damaged = [whole[:cut] for cut in range(len(whole))]
    for at in range(len(whole)):
        for bit in (0x01, 0x80):
            flipped = bytearray(whole)
            flipped[at] ^= bit
            damaged.append(bytes(flipped))
    for data in damaged:
        (tmp_path / j.META_NAME).write_bytes(data)
        with pytest.raises(j.JournalError):
            reopened(tmp_path)


# -- the dump ------------------------------------------------------------------------------------


def test_a_sealed_dump_opens_and_every_damage_is_refused(tmp_path: Path) -> None:
    payload = bytes(range(256)) * 3
    sealed = j.seal_dump(payload)
    assert j.open_dump(sealed, tmp_path) == payload
    for cut in range(len(j.DUMP_MAGIC), len(sealed)):
        with pytest.raises(j.JournalError):
            j.open_dump(sealed[:cut], tmp_path)
    for at in range(len(j.DUMP_MAGIC), len(sealed)):
        flipped = bytearray(sealed)
        flipped[at] ^= 0x20
        with pytest.raises(j.JournalError, match="checksum"):
            j.open_dump(bytes(flipped), tmp_path)


def test_bytes_without_the_seal_are_no_dump(tmp_path: Path) -> None:
    assert j.open_dump(b"\x95\x01", tmp_path) is None  # msgpack, no seal: refused by its reader
    with pytest.raises(CodecError, match="not sealed"):
        parse_dump(b"\x95\x01", str(tmp_path / "raft.dump"))


def test_a_zeroed_tail_or_file_is_never_read_as_entries(tmp_path: Path) -> None:
    """What some file systems leave after a crash: the size grown, the data zeros."""
    written(tmp_path).close()
    path = tmp_path / j.LOG_NAME
    whole = path.read_bytes()
    path.write_bytes(whole + bytes(4096))
    assert reopened(tmp_path).entries == ENTRIES
    last_start = record_offsets(tmp_path)[-2]
    path.write_bytes(whole[:last_start] + bytes(len(whole) - last_start))
    assert reopened(tmp_path).entries == ENTRIES[:-1]
    path.write_bytes(bytes(len(whole)))
    with pytest.raises(j.JournalError, match="not a raftbroker journal"):
        reopened(tmp_path)
    j.write_meta(tmp_path / j.META_NAME, j.Meta(7, None, 1), durable=False)
    size = (tmp_path / j.META_NAME).stat().st_size
    (tmp_path / j.META_NAME).write_bytes(bytes(size))
    with pytest.raises(j.JournalError):
        j.read_meta(tmp_path / j.META_NAME)
    sealed = j.seal_dump(b"\x95\x02")
    zeroed = sealed[: len(j.DUMP_MAGIC)] + bytes(len(sealed) - len(j.DUMP_MAGIC))
    with pytest.raises(j.JournalError, match="checksum"):
        j.open_dump(zeroed, tmp_path)
