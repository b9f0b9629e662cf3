"""A power cut, simulated: what a node's disk would still hold had it lost power.

Role: the chaos fault `lose-unsynced` (nemesis.py). A node started with `unsafe_record_syncs`
(a test-only setting, like `unsafe_disable_deduplication`) records every fsync it makes in a
ledger beside its data directory (`ledger_of`; `SyncRecorder`, installed by `raftbroker node`
before anything is opened); after the node is SIGKILLed, `cut_power` makes its Raft and
segment files what a power loss would have left, and the node is restarted on them. No FUSE:
the model is LazyFS's, "everything not synced is lost".

The ledger (`<ledger>/syncs`, one line per sync, appended with os.write: a SIGKILL loses none):
- `F <inode> <size>`: a regular file synced (fsync or fdatasync) while it held `size` bytes;
- `D <directory> <name>=<inode> ...`: a directory synced, with the regular files it held. A
  hard link to each such inode is kept in `<ledger>/inodes/`, so a file a later rename
  replaced can be brought back (the rename was not synced yet: the power cut undoes it).

The cut, for each file in scope (`in_scope`: Raft's `raft.wal`, `raft.meta`, `raft.dump`, their
`.tmp` files, and segment files): in a directory that was synced, exactly the files it held
then survive, each as the inode it named then (restored from its link when replaced since),
cut to the length last synced for that inode; in a directory never synced, a file survives
cut to its last synced length, and one never synced is gone. With `torn_tail_bytes_max`, a
file that was written past that length keeps a random part of what was written after it (a
write torn by the cut). Files out of scope (the data stamp, labels, the lock) are left as
they are: a simplification, since nothing durable depends on them.

Rules: the recorder replaces `os.fsync` and `os.fdatasync` in the node's process: test-only
instrumentation, installed only when the setting asks for it (never in production), and
wrapping, not changing, what they do.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import FileDescriptorLike

_Sync = Callable[["FileDescriptorLike"], None]
SCOPE = re.compile(r"^(raft\.(wal|meta|dump)(\.tmp)?|\d{20}\.log)$")
SYNCS_NAME = "syncs"
INODES_NAME = "inodes"


def ledger_of(data_dir: Path) -> Path:
    """Where a node with `unsafe_record_syncs` keeps its ledger: beside its data directory."""
    return data_dir.with_name(data_dir.name + ".syncs")


def in_scope(name: str) -> bool:
    return SCOPE.fullmatch(name) is not None


def _inode_key(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}"


def _link_name(key: str) -> str:
    """The name of the ledger's hard link to the inode `key`."""
    return key.replace(":", "-")


class SyncRecorder:
    """Records the node's fsyncs in a ledger (module doc); `install` makes it see them."""

    def __init__(self, ledger: Path) -> None:
        self.ledger = ledger
        (ledger / INODES_NAME).mkdir(parents=True, exist_ok=True)
        self._out = os.open(ledger / SYNCS_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._linked: set[str] = {p.name for p in (ledger / INODES_NAME).iterdir()}
        self._fsync: _Sync = os.fsync
        self._fdatasync: _Sync = os.fdatasync

    def install(self) -> None:
        self._fsync, self._fdatasync = os.fsync, os.fdatasync
        for name, sync in (("fsync", self._fsync), ("fdatasync", self._fdatasync)):
            setattr(os, name, self._recording(sync))

    def uninstall(self) -> None:
        """What `install` replaced, back (for tests, which install it in their own process)."""
        for name, sync in (("fsync", self._fsync), ("fdatasync", self._fdatasync)):
            setattr(os, name, sync)
        os.close(self._out)

    def _recording(self, sync: _Sync) -> _Sync:
        def recorded(fd: FileDescriptorLike) -> None:
            sync(fd)
            self.synced(fd if isinstance(fd, int) else fd.fileno())

        return recorded

    def synced(self, fd: int) -> None:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            self._write(f"F {_inode_key(st)} {st.st_size}\n")
        elif stat.S_ISDIR(st.st_mode):
            self._directory_synced(Path(os.readlink(f"/proc/self/fd/{fd}")))

    def _directory_synced(self, directory: Path) -> None:
        entries = []
        with os.scandir(directory) as found:
            for entry in found:
                if not (in_scope(entry.name) and entry.is_file(follow_symlinks=False)):
                    continue
                key = _inode_key(entry.stat(follow_symlinks=False))
                if _link_name(key) not in self._linked:
                    os.link(entry.path, self.ledger / INODES_NAME / _link_name(key))
                    self._linked.add(_link_name(key))
                entries.append(f"{entry.name}={key}")
        self._write(f"D {directory} {' '.join(entries)}\n")

    def _write(self, line: str) -> None:
        os.write(self._out, line.encode())


@dataclass(slots=True)
class Ledger:
    """What a ledger says: each inode's last synced size, each directory's last synced files."""

    sizes: dict[str, int] = field(default_factory=dict)
    directories: dict[Path, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def read(cls, ledger: Path) -> Ledger:
        found = cls()
        path = ledger / SYNCS_NAME
        text = path.read_text() if path.exists() else ""
        for line in text.splitlines():
            kind, _, rest = line.partition(" ")
            if kind == "F":
                key, size = rest.split(" ")
                found.sizes[key] = int(size)
            elif kind == "D":
                directory, *entries = rest.split(" ")
                named = dict(e.split("=", 1) for e in entries if e)
                found.directories[Path(directory)] = named
        return found


@dataclass(frozen=True, slots=True)
class CutReport:
    """What a power cut did to one node's files."""

    truncated: int  # files cut shorter
    removed: int  # files gone
    restored: int  # files brought back to the version a later, unsynced rename replaced
    bytes_lost: int


def cut_power(
    data_dir: Path, ledger: Path, rng: random.Random, torn_tail_bytes_max: int = 0
) -> CutReport:
    """Make `data_dir`'s files in scope what a power loss would have left (module doc)."""
    book = Ledger.read(ledger)
    cut = _Cut(book, ledger, rng, torn_tail_bytes_max)
    for directory in sorted({p.parent for p in data_dir.rglob("*") if in_scope(p.name)}):
        cut.directory(directory)
    for directory in sorted(book.directories):
        if directory.is_dir() and directory.is_relative_to(data_dir):
            cut.directory(directory)  # a synced directory whose files are all gone now
    return CutReport(cut.truncated, cut.removed, cut.restored, cut.bytes_lost)


@dataclass(slots=True)
class _Cut:
    book: Ledger
    ledger: Path
    rng: random.Random
    torn_tail_bytes_max: int
    done: set[Path] = field(default_factory=set)
    truncated: int = 0
    removed: int = 0
    restored: int = 0
    bytes_lost: int = 0

    def directory(self, directory: Path) -> None:
        if directory in self.done:
            return
        self.done.add(directory)
        durable = self.book.directories.get(directory)
        for path in [p for p in directory.iterdir() if in_scope(p.name) and p.is_file()]:
            if durable is not None and path.name not in durable:
                self._remove(path)  # created after the directory's last sync
            elif durable is None:
                self._keep_synced(path, _inode_key(path.stat()))
        for name, key in (durable or {}).items():
            path = directory / name
            if not path.exists() or _inode_key(path.stat()) != key:
                self._restore(path, key)
            self._keep_synced(path, key)

    def _keep_synced(self, path: Path, key: str) -> None:
        size = path.stat().st_size
        keep = self.book.sizes.get(key, 0)
        if keep == 0 and key not in self.book.sizes and path.parent not in self.book.directories:
            self._remove(path)  # never synced, in a directory never synced: never on disk
            return
        if size > keep and self.torn_tail_bytes_max:
            keep += self.rng.randrange(min(size - keep, self.torn_tail_bytes_max) + 1)
        if size > keep:
            os.truncate(path, keep)
            self.truncated += 1
            self.bytes_lost += size - keep

    def _restore(self, path: Path, key: str) -> None:
        source = self.ledger / INODES_NAME / _link_name(key)
        if path.exists():
            self.bytes_lost += path.stat().st_size
            path.unlink()
        shutil.copyfile(source, path)
        self.restored += 1
        # The copy is a new inode: what was synced of the old one carries over to it.
        self.book.sizes[_inode_key(path.stat())] = self.book.sizes.get(key, 0)

    def _remove(self, path: Path) -> None:
        self.bytes_lost += path.stat().st_size
        path.unlink()
        self.removed += 1
