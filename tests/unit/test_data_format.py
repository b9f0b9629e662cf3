"""The data directory's format stamp: a directory of another format is refused, never read."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.broker.layout import (
    DATA_FORMAT,
    FORMAT_FILE,
    METADATA_DIR,
    PARTITIONS_DIR,
    DataFormatError,
    check_data_format,
)


def test_an_empty_directory_is_stamped_and_then_accepted(tmp_path: Path) -> None:
    check_data_format(tmp_path)
    assert (tmp_path / FORMAT_FILE).read_text() == DATA_FORMAT + "\n"
    (tmp_path / METADATA_DIR).mkdir()
    check_data_format(tmp_path)  # its own data, on the next start


@pytest.mark.parametrize("group_dir", [METADATA_DIR, PARTITIONS_DIR])
def test_data_of_the_first_format_is_refused_with_one_line(tmp_path: Path, group_dir: str) -> None:
    (tmp_path / group_dir).mkdir()
    with pytest.raises(DataFormatError) as caught:
        check_data_format(tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    assert "format 1" in message
    assert "empty directory" in message
    assert not (tmp_path / FORMAT_FILE).exists(), "a refused directory is left as it was"


def test_a_directory_stamped_with_another_format_is_refused(tmp_path: Path) -> None:
    (tmp_path / FORMAT_FILE).write_text("raftbroker-data 4\n")
    with pytest.raises(DataFormatError, match="raftbroker-data 4"):
        check_data_format(tmp_path)


def test_a_directory_of_format_2_is_read_and_stamped_with_this_format(tmp_path: Path) -> None:
    (tmp_path / FORMAT_FILE).write_text("raftbroker-data 2\n")
    (tmp_path / PARTITIONS_DIR).mkdir()
    check_data_format(tmp_path)
    assert (tmp_path / FORMAT_FILE).read_text() == DATA_FORMAT + "\n"
    assert DATA_FORMAT == "raftbroker-data 3"
