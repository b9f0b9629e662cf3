"""A node's data directory: where each group keeps its files, by names that always fit.

    <data_dir>/metadata/                          the metadata group's Raft journal and snapshot
    <data_dir>/partitions/<topic id>-<partition>/ one per partition replica hosted here:
        topic        the topic's name and a newline, for operators (`cat partitions/*/topic`)
        raft/        the group's Raft journal and snapshot
        log/         segment files (`storage.py`)
        backfill/    while a restoration from peers runs (`replica.py`)

Rules: a file or directory name is built from numbers only, never from a topic's name, so it
fits every file system whatever the name (a valid name has up to 249 characters, and a name
over `NAME_BYTES_MAX` bytes is ENAMETOOLONG). The topic id is never reused, so a recreated
topic's replicas never meet a deleted one's leftovers.

Earlier versions named a partition's directory `<topic>-<partition>.<topic id>`; where a node
finds one for a replica it hosts, `prepare_partition_dir` renames it to the new name (one
`rename`, atomic: a crash leaves either name, and the next start renames what is left).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from statemachine.metadata import TopicInfo

log = logging.getLogger(__name__)

METADATA_DIR = "metadata"
PARTITIONS_DIR = "partitions"
TOPIC_FILE = "topic"
# NAME_MAX of Linux's file systems: no longer name can exist, and asking for one fails.
NAME_BYTES_MAX = 255


def metadata_dir(data_dir: Path) -> Path:
    return data_dir / METADATA_DIR


def partition_dir(data_dir: Path, topic_id: int, partition: int) -> Path:
    return data_dir / PARTITIONS_DIR / f"{topic_id}-{partition}"


def legacy_partition_dir(data_dir: Path, topic: TopicInfo, partition: int) -> Path | None:
    """Where an earlier version kept this replica; None where that name could not exist."""
    name = f"{topic.name}-{partition}.{topic.topic_id}"
    if len(os.fsencode(name)) > NAME_BYTES_MAX:
        return None
    return data_dir / PARTITIONS_DIR / name


def prepare_partition_dir(data_dir: Path, topic: TopicInfo, partition: int) -> Path:
    """The directory of a replica of `topic`'s `partition`, existing and labelled with the
    topic's name; an earlier version's directory for it is renamed to it first."""
    directory = partition_dir(data_dir, topic.topic_id, partition)
    legacy = legacy_partition_dir(data_dir, topic, partition)
    if legacy is not None and legacy.exists():
        if directory.exists():  # only by hand: both cannot come from us
            log.warning("%s exists beside %s: left alone, unused", legacy.name, directory.name)
        else:
            legacy.rename(directory)
            log.info("renamed partition directory %s to %s", legacy.name, directory.name)
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
