"""The Raft journal on disk: a group's log entries, term, vote and commit index, checksummed.

Role: pysyncobj keeps a group's log through a journal object; the adapter hands it one built
on `JournalFile` (adapter/journal_bridge.py, `JournalBridge`). This module owns the two files
and their recovery and imports nothing of pysyncobj. Entries are pysyncobj's tuples
`(command, index, term)`.

Files, in the group's directory:
- `raft.wal`: `MAGIC`, then one record per entry: `length` (u32), `crc` (u32), `index`
  (u64), `term` (u64), `command`, big-endian; `length` counts what follows the crc and the
  CRC-32C covers the same bytes. Appended to, except at two points: a follower's
  conflicting tail is cut off (ftruncate), and compaction, which keeps only the entries after
  a dump, writes them to a new file that replaces the old one (written, synced, renamed over
  it, the directory synced), so no crash leaves a file half rewritten.
- `raft.meta`: `META_MAGIC`, term (u64), commit index (u64), the vote (i16 length, -1 for
  none, then UTF-8), a CRC-32C of all before it; replaced whole the same way on each change.
- `raft.dump` (pysyncobj writes it through the adapter's serializer, to a new file renamed
  over the old): `DUMP_MAGIC`, the snapshot, a CRC-32C of both (`seal_dump`, `open_dump`).

Recovery, on open: records are read from the start. The first one that is torn (runs past
the end of the file), fails its CRC, or does not follow its predecessor's index ends the log:
the file is cut there and `dropped_bytes` says how much went (a crash in the middle of an
append, or a damaged disk: Raft then learns the rest from the leader again). A log file that
does not start with `MAGIC` and a meta file that fails its checks raise `JournalError`: a
replica whose term and vote are unknown could vote twice in one term, so it must not guess.

Durability: with `durable` (a node's `fsync = true`), `sync` makes every append and cut so far
durable (one fdatasync, however many entries: the caller syncs once per event, before any
message that reports them), and every meta change is synced before `store_meta` returns.
Without it, writes reach the page cache only; renames are still atomic.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from crc32c import crc32c

from cluster.errors import RaftbrokerError
from cluster.files import sync_directory
from statemachine.errors import ErrorCode

LOG_NAME = "raft.wal"
META_NAME = "raft.meta"
DUMP_NAME = "raft.dump"
MAGIC = b"RBWAL\x00\x00\x01"
META_MAGIC = b"RBMETA\x00\x01"
DUMP_MAGIC = b"RBDUMP\x00\x01"
_RECORD = struct.Struct(">IIQQ")  # length, crc, index, term
_INDEX_TERM = struct.Struct(">QQ")
_META = struct.Struct(">QQh")  # term, commit index, vote length (-1: none)
_CRC = struct.Struct(">I")
VOTE_BYTES_MAX = 1_024
# A record's length field counts index and term too; a command is at most this (a Raft entry
# is bounded far below by the node's limits: this only stops a damaged length early).
COMMAND_BYTES_MAX = 1 << 30

Entry = tuple[bytes, int, int]  # command, index, term: pysyncobj's shape


class JournalError(RaftbrokerError):
    """A journal or meta file that cannot be taken as it is (not ours, damaged, a short
    write): KAFKA_STORAGE_ERROR, as the segment store's errors."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.KAFKA_STORAGE_ERROR, message)


class Meta(NamedTuple):
    term: int
    voted_for: str | None
    commit_index: int


NO_META = Meta(0, None, 1)  # pysyncobj's defaults for a group that never stored any


class JournalFile:
    """One group's log and meta files; `entries` holds the log in memory (as pysyncobj's)."""

    def __init__(self, directory: Path, *, durable: bool) -> None:
        self.directory = directory
        self.durable = durable
        self.path = directory / LOG_NAME
        self.meta_path = directory / META_NAME
        self.entries: list[Entry] = []
        self._ends: list[int] = []  # the file offset where each entry's record ends
        self._dirty = False  # appended or cut since the last sync
        self.dropped_bytes = 0
        self.meta = read_meta(self.meta_path)
        self._fd = self._open()

    # -- the log -------------------------------------------------------------------------------

    @property
    def end(self) -> int:
        return self._ends[-1] if self._ends else len(MAGIC)

    def append(self, command: bytes, index: int, term: int) -> None:
        assert not self.entries or index == self.entries[-1][1] + 1, "entries follow each other"
        head = _record_head(command, index, term)
        offset = self.end
        written = os.pwritev(self._fd, (head, command), offset)
        if written != len(head) + len(command):
            raise JournalError(f"{self.path}: a short write ({written} bytes)")
        self.entries.append((command, index, term))
        self._ends.append(offset + written)
        self._dirty = True

    def truncate_from(self, position: int) -> None:
        """Drop `entries[position:]` (a follower's tail that its leader's log replaces)."""
        if position >= len(self.entries):
            return
        end = self._ends[position - 1] if position > 0 else len(MAGIC)
        os.ftruncate(self._fd, end)
        del self.entries[position:]
        del self._ends[position:]
        self._dirty = True

    def rewrite(self, entries: Iterable[Entry]) -> None:
        """The log becomes `entries` (compaction, or a dump installed): written to a new file
        that replaces this one, so a crash leaves either the old log or the new one."""
        kept = list(entries)
        if self.durable:
            # Renames before this one here (the dump this compaction follows) durable first:
            # the shorter log must never outlive the dump it relies on.
            sync_directory(self.directory)
        ends = install_log(self.directory, kept, durable=self.durable)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_RDWR)
        self.entries, self._ends = kept, ends
        self._dirty = False

    def sync(self) -> None:
        """Make every append and cut so far durable (no-op unless `durable` and dirty)."""
        if self._dirty and self.durable:
            os.fdatasync(self._fd)
        self._dirty = False

    @property
    def dirty(self) -> bool:
        """Appended or cut since the last `sync`."""
        return self._dirty

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # -- term, vote, commit index -----------------------------------------------------------

    def store_meta(self, meta: Meta) -> None:
        write_meta(self.meta_path, meta, durable=self.durable)
        self.meta = meta

    # -- opening ---------------------------------------------------------------------------

    def _open(self) -> int:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                os.pwrite(fd, MAGIC, 0)
                if self.durable:
                    os.fdatasync(fd)
                    sync_directory(self.directory)
                return fd
            entries, ends = self._recover(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self.entries, self._ends = entries, ends
        return fd

    def _recover(self, fd: int, size: int) -> tuple[list[Entry], list[int]]:
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mapped:
            if size < len(MAGIC) or mapped[: len(MAGIC)] != MAGIC:
                raise JournalError(f"{self.path} is not a raftbroker journal (no {MAGIC!r})")
            entries, ends = read_records(memoryview(mapped), len(MAGIC))
        good = ends[-1] if ends else len(MAGIC)
        if good < size:
            self.dropped_bytes = size - good
            os.ftruncate(fd, good)
            if self.durable:
                os.fdatasync(fd)
        return entries, ends


def read_records(data: memoryview, offset: int) -> tuple[list[Entry], list[int]]:
    """The whole records in `data` from `offset`, up to the first torn, damaged or
    out-of-order one, and where each ends."""
    entries: list[Entry] = []
    ends: list[int] = []
    size = len(data)
    try:
        while offset + _RECORD.size <= size:
            length, crc, index, term = _RECORD.unpack_from(data, offset)
            end = offset + _CRC.size * 2 + length
            if length < _INDEX_TERM.size or length > COMMAND_BYTES_MAX or end > size:
                break
            body = data[offset + _CRC.size * 2 : end]
            if crc32c(body) != crc:
                break
            if entries and index != entries[-1][1] + 1:
                break
            entries.append((bytes(body[_INDEX_TERM.size :]), index, term))
            ends.append(end)
            offset = end
    finally:
        data.release()
    return entries, ends


def install_log(directory: Path, entries: list[Entry], *, durable: bool) -> list[int]:
    """`directory`'s log becomes `entries`, whole or not at all: written to `raft.wal.tmp`,
    renamed over `raft.wal`, the directory synced when `durable`; where each record ends."""
    tmp = directory / (LOG_NAME + ".tmp")
    ends = write_log(tmp, entries, durable=durable)
    os.replace(tmp, directory / LOG_NAME)
    if durable:
        sync_directory(directory)
    return ends


def write_log(path: Path, entries: list[Entry], *, durable: bool) -> list[int]:
    """A whole log file of `entries` at `path` (synced when `durable`); where each record
    ends."""
    ends = []
    with path.open("wb") as f:
        f.write(MAGIC)
        for command, index, term in entries:
            f.write(_record_head(command, index, term))
            f.write(command)
            ends.append(f.tell())
        f.flush()
        if durable:
            os.fdatasync(f.fileno())
    return ends


def _record_head(command: bytes, index: int, term: int) -> bytes:
    index_term = _INDEX_TERM.pack(index, term)
    crc = crc32c(command, crc32c(index_term))
    return _RECORD.pack(len(index_term) + len(command), crc, index, term)


# -- the meta file ---------------------------------------------------------------------------


def encode_meta(meta: Meta) -> bytes:
    vote = b"" if meta.voted_for is None else meta.voted_for.encode()
    assert len(vote) <= VOTE_BYTES_MAX, "a node address is short"
    vote_length = -1 if meta.voted_for is None else len(vote)
    body = META_MAGIC + _META.pack(meta.term, meta.commit_index, vote_length) + vote
    return body + _CRC.pack(crc32c(body))


def decode_meta(data: bytes, path: Path) -> Meta:
    """The meta in `data`; JournalError naming `path` when it is not whole and ours."""
    fixed = len(META_MAGIC) + _META.size
    if len(data) < fixed + _CRC.size or not data.startswith(META_MAGIC):
        raise JournalError(f"{path}: not a raftbroker meta file, or cut short")
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    if crc32c(data[: -_CRC.size]) != crc:
        raise JournalError(f"{path}: its checksum does not match (term and vote unknown)")
    term, commit_index, vote_length = _META.unpack_from(data, len(META_MAGIC))
    if fixed + max(vote_length, 0) + _CRC.size != len(data) or vote_length < -1:
        raise JournalError(f"{path}: its vote's length does not match the file")
    vote = None if vote_length < 0 else data[fixed : fixed + vote_length].decode()
    return Meta(term, vote, commit_index)


def read_meta(path: Path) -> Meta:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return NO_META
    return decode_meta(data, path)


def write_meta(path: Path, meta: Meta, *, durable: bool) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(encode_meta(meta))
        f.flush()
        if durable:
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        sync_directory(path.parent)


# -- the dump (the snapshot the log was compacted to) ------------------------------------------


def seal_dump(payload: bytes) -> bytes:
    """A dump file's bytes: `DUMP_MAGIC`, `payload`, a CRC-32C of both."""
    body = DUMP_MAGIC + payload
    return body + _CRC.pack(crc32c(body))


def open_dump(data: bytes, path: Path) -> bytes | None:
    """The payload of a sealed dump; None for a dump written before dumps were sealed (read
    as it is); JournalError naming `path` when a sealed one is cut or damaged."""
    if not data.startswith(DUMP_MAGIC):
        return None
    if len(data) < len(DUMP_MAGIC) + _CRC.size:
        raise JournalError(f"{path}: cut short")
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    if crc32c(memoryview(data)[: -_CRC.size]) != crc:
        raise JournalError(f"{path}: its checksum does not match")
    return data[len(DUMP_MAGIC) : -_CRC.size]
