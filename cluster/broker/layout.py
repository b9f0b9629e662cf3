"""A node's data directory: where each group keeps its files, by names that always fit.

    <data_dir>/node.lock                          held by the node process that uses the directory
    <data_dir>/metadata/                          the metadata group's Raft journal and snapshot
    <data_dir>/partitions/<topic id>-<partition>/ one per partition replica hosted here:
        topic        the topic's name and a newline, for operators (`cat partitions/*/topic`)
        raft/        the group's Raft journal and snapshot
        log/         segment files (`storage/`)
        backfill/    while a restoration from peers runs (`replica.py`)

Rules: a file or directory name is built from numbers only, never from a topic's name, so it
fits every file system whatever the name (a valid name has up to 249 characters, and a name
over `NAME_BYTES_MAX` bytes is ENAMETOOLONG). The topic id is never reused, so a recreated
topic's replicas never meet a deleted one's leftovers.

A node process holds an exclusive POSIX record lock on `node.lock` for as long as it runs
(`lock_data_dir`), so two nodes never share a directory, and whoever asks which process is the
node of a directory (`lock_holder`: the local launcher, before it signals one) gets the kernel's
answer, not a pid file's. The kernel drops the lock when the process ends, however it ends.

`<data_dir>/format` names the format of what the directory holds (`DATA_FORMAT`). Records are
Kafka record batches (v2) since format 2; a directory of an earlier version (records in
raftbroker's own msgpack batches, in its Raft journals as in its segments) is refused with one
line (`check_data_format`), never half read: it holds no data a user of this version can have
made, and a converter would have to rewrite every journal entry of every group. Format 3 adds a
kind of segment frame (storage.py, `HEAD_CHECKED`) and reads format 2's frames as they are: a
directory of format 2 is stamped 3 when a node of this version starts on it, so that an older
node, which would take the new frames for damage, refuses it from then on.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
from pathlib import Path

from cluster.files import sync_directory
from statemachine.metadata import TopicInfo

log = logging.getLogger(__name__)

METADATA_DIR = "metadata"
PARTITIONS_DIR = "partitions"
TOPIC_FILE = "topic"
# NAME_MAX of Linux's file systems: no longer name can exist, and asking for one fails.
NAME_BYTES_MAX = 255
LOCK_FILE = "node.lock"
FORMAT_FILE = "format"
# 2: record batch v2 (Kafka's) in journals and segments; 3: HEAD_CHECKED segment frames as well
DATA_FORMAT = "raftbroker-data 3"
_READ_AS_IS = ("raftbroker-data 2",)  # older formats this version reads, stamped DATA_FORMAT


class DataDirLockedError(OSError):
    """Another process holds the data directory's lock: it is that directory's node."""

    def __init__(self, data_dir: Path, holder: int | None) -> None:
        who = "another process" if holder is None else f"process {holder}"
        super().__init__(f"data directory {data_dir} is in use by {who}: a node runs there")
        self.holder = holder


class DataFormatError(OSError):
    """The data directory holds data of a format this version does not read."""


def check_data_format(data_dir: Path) -> None:
    """Stamp an empty directory, or one of a format this version reads as it is, with
    `DATA_FORMAT`; DataFormatError for one that holds data of another format (a directory with
    groups but no stamp predates format 2)."""
    stamp = data_dir / FORMAT_FILE
    try:
        found = stamp.read_text().strip()
    except FileNotFoundError:
        found = None
    if found == DATA_FORMAT:
        return
    if found in _READ_AS_IS:
        log.info("data directory %s: %s, stamped %s", data_dir, found, DATA_FORMAT)
    elif found is not None or any((data_dir / d).exists() for d in (METADATA_DIR, PARTITIONS_DIR)):
        raise DataFormatError(
            f"data directory {data_dir} holds data of another raftbroker version "
            f"({found or 'format 1, msgpack record batches'}); this version stores Kafka record "
            f"batches ({DATA_FORMAT}) and does not convert it: start on an empty directory"
        )
    tmp = stamp.with_suffix(".tmp")
    with tmp.open("w") as f:
        f.write(DATA_FORMAT + "\n")
        f.flush()
        os.fsync(f.fileno())  # a stamp lost to a power cut would leave the data refused
    os.replace(tmp, stamp)
    sync_directory(data_dir)


class _Flock(ctypes.Structure):
    """`struct flock` of Linux (off_t of 64 bits, as Python builds with large-file support)."""

    _fields_ = (
        ("l_type", ctypes.c_short),
        ("l_whence", ctypes.c_short),
        ("l_start", ctypes.c_int64),
        ("l_len", ctypes.c_int64),
        ("l_pid", ctypes.c_int32),
    )


def lock_data_dir(data_dir: Path) -> int:
    """Take the node's lock on `data_dir` for the life of this process; its descriptor, which
    must stay open (closing any descriptor of the file in this process drops a POSIX lock).
    DataDirLockedError, naming the holder, when another process holds it."""
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in (errno.EACCES, errno.EAGAIN):
            raise
        raise DataDirLockedError(data_dir, lock_holder(data_dir)) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())  # for people; the lock is what counts
    return fd


def lock_holder(data_dir: Path) -> int | None:
    """The pid of the process that holds `data_dir`'s node lock, or None: the kernel's answer
    (F_GETLK), so a pid that was reused, or a pid file left behind, can never name a node.
    Never asked by the node itself: its own lock does not conflict with it, and closing the
    descriptor opened here would drop that lock."""
    try:
        fd = os.open(data_dir / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        probe = _Flock(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        answer = _Flock.from_buffer_copy(fcntl.fcntl(fd, fcntl.F_GETLK, bytes(probe)))
    finally:
        os.close(fd)
    return None if answer.l_type == fcntl.F_UNLCK or answer.l_pid <= 0 else int(answer.l_pid)


def metadata_dir(data_dir: Path) -> Path:
    return data_dir / METADATA_DIR


def partition_dir(data_dir: Path, topic_id: int, partition: int) -> Path:
    return data_dir / PARTITIONS_DIR / f"{topic_id}-{partition}"


def prepare_partition_dir(data_dir: Path, topic: TopicInfo, partition: int) -> Path:
    """The directory of a replica of `topic`'s `partition`, existing and labelled with the
    topic's name."""
    directory = partition_dir(data_dir, topic.topic_id, partition)
    directory.mkdir(parents=True, exist_ok=True)
    _label(directory, topic.name)
    return directory


def _label(directory: Path, topic: str) -> None:
    """Write the `topic` file unless it already says `topic`: through a temporary file and a
    rename, so it is never seen half-written. Not fsynced: nothing but operators reads it, and
    a start after a crash writes it again."""
    path = directory / TOPIC_FILE
    text = topic + "\n"
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return
    temporary = directory / (TOPIC_FILE + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(path)
