"""The data directory's names: by topic id and partition, labelled with the topic's name."""

from __future__ import annotations

from pathlib import Path

from cluster.broker import layout
from statemachine.metadata import TopicInfo


def topic(name: str, topic_id: int, partitions: int = 12) -> TopicInfo:
    return TopicInfo(name, topic_id, ((1, 2, 3),) * partitions, -1, -1)


def test_a_new_replica_gets_a_numbered_labelled_directory(tmp_path: Path) -> None:
    directory = layout.prepare_partition_dir(tmp_path, topic("orders", 7), 3)
    assert directory == tmp_path / "partitions" / "7-3"
    assert (directory / "topic").read_text() == "orders\n"
    assert [p.name for p in directory.iterdir()] == ["topic"]  # no temporary file left


def test_the_longest_name_fits_whatever_the_id(tmp_path: Path) -> None:
    long = topic("x" * 249, 2**63 - 1, partitions=1_024)
    directory = layout.prepare_partition_dir(tmp_path, long, 1_023)
    assert len(directory.name) <= layout.NAME_BYTES_MAX
    assert (directory / "topic").read_text() == "x" * 249 + "\n"


def test_a_wrong_label_is_rewritten(tmp_path: Path) -> None:
    directory = layout.prepare_partition_dir(tmp_path, topic("orders", 7), 3)
    (directory / "topic").write_text("garbled")
    layout.prepare_partition_dir(tmp_path, topic("orders", 7), 3)
    assert (directory / "topic").read_text() == "orders\n"
