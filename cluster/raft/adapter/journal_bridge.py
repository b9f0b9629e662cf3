"""pysyncobj's journal interface over our own journal files (cluster/raft/journal.py): a
CRC-32C per record, recovery to the last whole one, compaction by rename, meta with a CRC.
Part of the Raft adapter (cluster/raft/adapter/__init__.py has its rules).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pysyncobj.journal import Journal

from cluster.raft.journal import (
    JournalFile,
    Meta,
)


class JournalBridge(Journal):  # type: ignore[misc]
    """pysyncobj's journal interface over our files (cluster/raft/journal.py): a CRC-32C on
    every record and on the meta, recovery to the last whole record, compaction that writes a
    new file and renames it over the old one, and with `durable` an fsync per `sync` (the
    group syncs once per event before anything reports what it appended) and per change of
    term or vote (before the vote or the term is used, as Raft requires).

    The commit index is stored lazily, on pysyncobj's one-second timer, as stock does: a
    replica that comes back with an older one only applies again what it had applied.

    Past `bytes_max` in its file (and in memory: pysyncobj keeps the log as a list), an append
    asks for a compaction (`on_full`), as pysyncobj's own bound asks by entry count and time
    only."""

    def __init__(self, file: JournalFile, bytes_max: int, on_full: Callable[[], None]) -> None:
        self.file = file
        self._commit_index = file.meta.commit_index
        self._bytes_max = bytes_max
        self._on_full = on_full

    def add(self, command: bytes, idx: int, term: int) -> None:
        self.file.append(command, idx, term)
        if self.file.end > self._bytes_max:
            self._on_full()

    def clear(self) -> None:
        self.file.rewrite(())

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802, N803
        self.file.truncate_from(entryFrom)

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802, N803
        self.file.rewrite(self.file.entries[entryTo:])

    def __getitem__(self, item: Any) -> Any:
        return self.file.entries[item]

    def __len__(self) -> int:
        return len(self.file.entries)

    def _destroy(self) -> None:
        self._store_commit_index()
        self.file.close()

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:  # noqa: N802, N803
        self._commit_index = raftCommitIndex

    def getRaftCommitIndex(self) -> int:  # noqa: N802
        return self.file.meta.commit_index

    def setCurrentTerm(self, term: int, votedForNodeId: str | None) -> None:  # noqa: N802, N803
        self.file.store_meta(Meta(term, votedForNodeId, self._commit_index))

    def getCurrentTerm(self) -> int:  # noqa: N802
        return self.file.meta.term

    def getVotedForNodeId(self) -> str | None:  # noqa: N802
        return self.file.meta.voted_for

    def onOneSecondTimer(self) -> None:  # noqa: N802
        self._store_commit_index()

    def _store_commit_index(self) -> None:
        if self._commit_index != self.file.meta.commit_index and not self.file.closed:
            self.file.store_meta(self.file.meta._replace(commit_index=self._commit_index))
