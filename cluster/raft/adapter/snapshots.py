"""pysyncobj's serializer hooks: a group's dump (the machine's canonical bytes and pysyncobj's
two boundary entries, msgpack, sealed with a CRC-32C), written, read and judged.
Part of the Raft adapter (cluster/raft/adapter/__init__.py has its rules).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pysyncobj.node import TCPNode

from cluster.files import sync_directory
from cluster.raft.journal import (
    DUMP_NAME,
    JournalError,
    open_dump,
    seal_dump,
)
from cluster.raft.spec import ReplicatedMachine
from statemachine.codec import CodecError, pack, unpack

SNAPSHOT_FORMAT = 2  # sealed with a CRC-32C; format 1 (unsealed) is refused as damaged


class SnapshotFile:
    """pysyncobj's serializer hooks: the dump, `[format, machine bytes, last entry, prev
    entry, nodes]` in msgpack, sealed with a CRC-32C (journal.py: `seal_dump`)."""

    def __init__(self, machine: ReplicatedMachine, *, durable: bool = False) -> None:
        self._machine = machine
        self._durable = durable

    def serialize(self, path: str, raft_data: Any) -> None:
        last_entry, prev_entry, nodes = raft_data
        payload = pack(
            [
                SNAPSHOT_FORMAT,
                self._machine.snapshot(),
                list(last_entry),
                list(prev_entry),
                sorted(n.address for n in nodes),
            ]
        )
        with open(path, "wb") as f:
            f.write(seal_dump(payload))
            f.flush()
            os.fsync(f.fileno())  # the dump replaces journal entries: it must outlive a crash

    def deserialize(self, path: str) -> tuple[Any, ...]:
        with open(path, "rb") as f:
            data = f.read()
            if self._durable:  # a dump installed from the leader, acknowledged after this
                os.fsync(f.fileno())
                sync_directory(Path(path).parent)
        machine, last_entry, prev_entry, addresses = parse_dump(data, path)
        self._machine.restore(machine)
        # pysyncobj compares these with its journal's tuples: they must be tuples, not lists.
        return tuple(last_entry), tuple(prev_entry), {TCPNode(a) for a in addresses}


def parse_dump(data: bytes, path: str) -> tuple[bytes, Any, Any, Any]:
    """A dump's machine snapshot, last and previous entries and node addresses; CodecError
    (or JournalError) naming `path` for anything else."""
    payload = open_dump(data, Path(path))
    if payload is None:
        raise CodecError(f"raft dump {path}: not sealed (a dump of format {SNAPSHOT_FORMAT} is)")
    try:
        raw = unpack(payload, size_max=len(data))
    except CodecError as exc:
        raise CodecError(f"raft dump {path}: {exc}") from exc
    if not (isinstance(raw, tuple) and len(raw) == 5 and raw[0] == SNAPSHOT_FORMAT):
        raise CodecError(f"raft dump {path}: not a format-{SNAPSHOT_FORMAT} dump")
    _, machine, last_entry, prev_entry, addresses = raw
    return machine, last_entry, prev_entry, addresses


def damaged_dump(directory: Path) -> str | None:
    """Why the group's dump cannot be loaded, or None (no dump, or a sound one)."""
    path = directory / DUMP_NAME
    try:
        parse_dump(path.read_bytes(), str(path))
    except FileNotFoundError:
        return None
    except (CodecError, JournalError) as exc:
        return str(exc)
    return None
