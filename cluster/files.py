"""Files that must outlive a crash: the one way to make a directory's entries durable.

Role: a helper shared by the segment store (cluster/broker/storage/) and the Raft journal
(cluster/raft/journal.py), which both create, rename and delete files whose existence a
restart relies on. Rule: a rename or a creation is durable only once its directory is
fsynced, as the file's own contents only once the file is.
"""

from __future__ import annotations

import os
from pathlib import Path


def sync_directory(directory: Path) -> None:
    """Make file creations, renames and deletions in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
