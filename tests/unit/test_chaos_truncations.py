"""A chaos run's anomaly `raft-applied-truncation`: every line of every node's log where a
Raft replica deleted entries it had applied, and none of the others, reaches the checker."""

from __future__ import annotations

from pathlib import Path

from cluster.chaos.checker import check
from cluster.chaos.history import parse_event
from cluster.chaos.runner import APPLIED_TRUNCATION, applied_truncations
from cluster.raft.adapter import appends

LINE = (
    "2026-11-30 02:16:46,675 node3 CRITICAL pysyncobj.syncobj: truncating already-applied log "
    "entries from index 175 (last applied: 212) - state machine may have diverged from other "
    "cluster members"
)


def test_every_truncation_of_applied_entries_is_found(tmp_path: Path) -> None:
    (tmp_path / "node1.log").write_text("INFO started\nINFO serving\n")
    (tmp_path / "node3.log").write_text(f"INFO started\n{LINE}\nINFO serving\n{LINE}\n")
    (tmp_path / "other.txt").write_text(LINE)
    assert applied_truncations(tmp_path) == [("node3", LINE), ("node3", LINE)]
    assert applied_truncations(tmp_path / "absent") == []


def test_the_runner_looks_for_the_words_the_replica_logs() -> None:
    assert appends.APPLIED_TRUNCATION.startswith(APPLIED_TRUNCATION)


def test_a_truncation_is_an_anomaly() -> None:
    event = {"type": "info", "process": "nemesis", "f": "raft_truncation", "time_ms": 1}
    report = check([parse_event({**event, "node": "node3", "line": LINE})])
    assert report.counts_by_kind["raft-applied-truncation"] == 1
    assert not report.ok
    assert check([]).counts_by_kind["raft-applied-truncation"] == 0
