"""The chaos report's count of applied Raft entries truncated (pysyncobj's CRITICAL line):
every such line of every node's log, and none of the others."""

from __future__ import annotations

from pathlib import Path

from cluster.chaos.runner import applied_truncations

LINE = (
    "2026-11-30 02:16:46,675 node3 CRITICAL pysyncobj.syncobj: truncating already-applied log "
    "entries from index 175 (last applied: 212) - state machine may have diverged from other "
    "cluster members"
)


def test_every_truncation_of_applied_entries_is_found(tmp_path: Path) -> None:
    (tmp_path / "node1.log").write_text("INFO started\nINFO serving\n")
    (tmp_path / "node3.log").write_text(f"INFO started\n{LINE}\nINFO serving\n{LINE}\n")
    (tmp_path / "other.txt").write_text(LINE)
    assert applied_truncations(tmp_path) == [LINE, LINE]
    assert applied_truncations(tmp_path / "absent") == []
