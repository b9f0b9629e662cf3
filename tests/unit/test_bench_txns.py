"""The transactions section of the combined benchmark report (bench/compare_txns.py): each
broker's figures side by side, issue 37's goals as each broker's own ratios, with verdicts, and
"not measured" for a side that produced nothing."""

from __future__ import annotations

from typing import Any

from bench import compare, compare_txns
from tests.unit.test_bench_compare import ours, peer


def broker(txn_rate: int, commit_p50: float) -> dict[str, Any]:
    plain = 400_000
    sequential = 0.3
    committed, uncommitted = 950_000, 1_000_000
    return {
        "plain": {"records_per_s": plain},
        "txn_100": {"records_per_s": txn_rate, "commit": {"p50_ms": commit_p50, "p99_ms": 9.0}},
        "txn_10000": {"records_per_s": 600_000, "commit": {"p50_ms": 7.0}},
        "sequential": {"p50_ms": sequential},
        "consume": {
            "read_committed": {"records_per_s": committed},
            "read_uncommitted": {"records_per_s": uncommitted},
        },
        "ctp": {"records_per_s": 460_000},
        "goals": {
            "txn_100_vs_plain": round(txn_rate / plain, 3),
            "txn_100_vs_plain_met": txn_rate >= 0.5 * plain,
            "commit_p50_vs_sequential_p50": round(commit_p50 / sequential, 2),
            "commit_p50_met": commit_p50 <= 3 * sequential,
            "read_committed_vs_uncommitted": committed / uncommitted,
            "read_committed_met": True,
        },
    }


def test_the_section_shows_both_brokers_and_the_goals_verdicts() -> None:
    report = {"raftbroker": broker(21_000, 3.85), "apache_kafka": broker(1_500, 58.8)}
    combined = compare.combine(ours(), peer(), txns=report)
    text = compare.markdown(combined)
    assert "## Transactions (issue 37)" in text
    assert "| 100-record transactions, sequential: records/s | 21,000 | 1,500 | 14.00 |" in text
    assert "| commit p50 / sequential produce p50 | <= 3 | 12.830 | **no** | 196.000 |" in text
    assert "| read_committed / read_uncommitted | >= 0.9 | 0.950 | yes | 0.950 |" in text


def test_a_side_that_produced_nothing_is_not_measured() -> None:
    figures = compare_txns.txn_figures({"errors": {"apache-kafka": "no java"}})
    text = "\n".join(compare_txns.markdown(figures))
    assert "| 100-record transactions / plain records/s | >= 0.5 | - | not measured | - |" in text
    assert figures["errors"] == {"apache-kafka": "no java"}
