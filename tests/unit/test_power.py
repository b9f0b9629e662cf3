"""The simulated power cut (cluster/chaos/power.py) against the Raft journal's own files.

What a cut leaves must be what the journal synced, no more and no less: entries and meta
synced with `durable` survive it whole, what came after is gone (or torn, and then cut by the
journal's recovery), and without `durable` nothing the journal wrote survives. A rename not
yet synced is undone: the file it replaced comes back.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.chaos import power
from cluster.raft import journal as j

ENTRIES = [(b"\x00e" + bytes([i]) * 40, i + 1, 1) for i in range(20)]


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Path]:
    """A recorder installed in this process for the test's length, as a node installs it."""
    recorder = power.SyncRecorder(tmp_path / "ledger")
    recorder.install()
    try:
        yield tmp_path / "ledger"
    finally:
        recorder.uninstall()


def group_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "data" / "partitions" / "1-0" / "raft"
    directory.mkdir(parents=True)
    return directory


def cut(tmp_path: Path, ledger: Path, torn_tail_bytes_max: int = 0) -> power.CutReport:
    return power.cut_power(tmp_path / "data", ledger, random.Random(7), torn_tail_bytes_max)


def test_what_a_durable_journal_synced_survives_and_nothing_after(
    tmp_path: Path, ledger: Path
) -> None:
    directory = group_dir(tmp_path)
    f = j.JournalFile(directory, durable=True)
    for entry in ENTRIES[:12]:
        f.append(*entry)
    f.sync()
    f.store_meta(j.Meta(3, "127.0.0.3:1", 9))
    for entry in ENTRIES[12:]:
        f.append(*entry)  # written, never synced
    f.close()
    report = cut(tmp_path, ledger)
    assert report.truncated == 1 and report.bytes_lost > 0
    after = j.JournalFile(directory, durable=True)
    assert after.entries == ENTRIES[:12]
    assert after.meta == j.Meta(3, "127.0.0.3:1", 9)


def test_a_torn_tail_is_cut_by_the_journals_recovery(tmp_path: Path, ledger: Path) -> None:
    directory = group_dir(tmp_path)
    f = j.JournalFile(directory, durable=True)
    for entry in ENTRIES[:12]:
        f.append(*entry)
    f.sync()
    for entry in ENTRIES[12:]:
        f.append(*entry)
    f.close()
    cut(tmp_path, ledger, torn_tail_bytes_max=200)
    after = j.JournalFile(directory, durable=True)
    assert after.entries[:12] == ENTRIES[:12]
    assert after.entries == ENTRIES[: len(after.entries)], "a prefix, whole records only"


def test_without_durable_nothing_the_journal_wrote_survives(tmp_path: Path, ledger: Path) -> None:
    directory = group_dir(tmp_path)
    f = j.JournalFile(directory, durable=False)
    for entry in ENTRIES:
        f.append(*entry)
    f.sync()  # a no-op without `durable`
    f.store_meta(j.Meta(3, None, 9))
    f.close()
    report = cut(tmp_path, ledger)
    assert report.removed == 2  # the log and the meta were never synced
    after = j.JournalFile(directory, durable=False)
    assert after.entries == []
    assert after.meta == j.NO_META


def test_a_rename_not_synced_is_undone(tmp_path: Path, ledger: Path) -> None:
    directory = group_dir(tmp_path)
    j.write_meta(directory / j.META_NAME, j.Meta(3, None, 9), durable=True)
    # Written and synced as a file, renamed over the old one, but the directory not synced.
    tmp = directory / (j.META_NAME + ".tmp")
    tmp.write_bytes(j.encode_meta(j.Meta(4, "127.0.0.4:1", 9)))
    fd = os.open(tmp, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    os.replace(tmp, directory / j.META_NAME)
    report = cut(tmp_path, ledger)
    assert report.restored == 1
    assert j.read_meta(directory / j.META_NAME) == j.Meta(3, None, 9)


def test_a_compaction_synced_survives_whole(tmp_path: Path, ledger: Path) -> None:
    directory = group_dir(tmp_path)
    f = j.JournalFile(directory, durable=True)
    for entry in ENTRIES:
        f.append(*entry)
    f.sync()
    f.rewrite(ENTRIES[15:])
    f.append(b"\x00after", 21, 2)  # not synced
    f.close()
    cut(tmp_path, ledger)
    assert j.JournalFile(directory, durable=True).entries == ENTRIES[15:]
