"""Transactions in the combined report: `bench.kafka_txns`'s figures for raftbroker's Kafka
listener and for Apache Kafka, the goals of issue 37 (each broker against its own baseline, as
the issue states them), and their section of RESULTS.md.

Role: pure functions from the `bench.kafka_txns` report to figures and markdown (`bench.compare`
puts them in the combined report); no I/O. A figure a side did not produce is None, never a
guess.
"""

from __future__ import annotations

from typing import Any

from bench.report import dig, number

SIDES = ("raftbroker", "apache_kafka")

# (label, path in a broker's report, digits)
ROWS: tuple[tuple[str, tuple[str, ...], int], ...] = (
    ("plain idempotent producer, records/s (the baseline)", ("plain", "records_per_s"), 0),
    ("100-record transactions, sequential: records/s", ("txn_100", "records_per_s"), 0),
    ("100-record transactions: commit p50, ms", ("txn_100", "commit", "p50_ms"), 2),
    ("100-record transactions: commit p99, ms", ("txn_100", "commit", "p99_ms"), 2),
    ("10,000-record transactions: records/s", ("txn_10000", "records_per_s"), 0),
    ("10,000-record transactions: commit p50, ms", ("txn_10000", "commit", "p50_ms"), 2),
    ("sequential idempotent produce p50, ms", ("sequential", "p50_ms"), 3),
    ("read_committed consume, records/s (kcat)", ("consume", "read_committed", "records_per_s"), 0),
    (
        "read_uncommitted consume, same data, records/s (kcat)",
        ("consume", "read_uncommitted", "records_per_s"),
        0,
    ),
    ("consume-transform-produce exactly once, records/s", ("ctp", "records_per_s"), 0),
)

# Issue 37's goals, each a ratio within one broker's run: (label, its ratio and its verdict in
# `bench.kafka_txns.goals`, bound).
GOALS = (
    (
        "100-record transactions / plain records/s",
        "txn_100_vs_plain",
        "txn_100_vs_plain_met",
        ">= 0.5",
    ),
    (
        "commit p50 / sequential produce p50",
        "commit_p50_vs_sequential_p50",
        "commit_p50_met",
        "<= 3",
    ),
    (
        "read_committed / read_uncommitted",
        "read_committed_vs_uncommitted",
        "read_committed_met",
        ">= 0.9",
    ),
)


def txn_figures(report: dict[str, Any] | None) -> dict[str, Any]:
    """Each side's figures (by row label) and goal ratios, and the run's errors."""
    report = report or {}
    figures: dict[str, Any] = {}
    for side in SIDES:
        broker = report.get(side) or {}
        figures[side] = {
            "rows": {label: dig(broker, *path) for label, path, _ in ROWS},
            "goals": {
                name: {"ratio": dig(broker, "goals", name), "met": dig(broker, "goals", met)}
                for _, name, met, _ in GOALS
            },
        }
    figures["errors"] = report.get("errors") or {}
    return figures


def markdown(figures: dict[str, Any]) -> list[str]:
    """The transactions section of RESULTS.md."""
    ours, theirs = figures["raftbroker"], figures["apache_kafka"]
    lines = [
        "## Transactions (issue 37), raftbroker's Kafka listener vs Apache Kafka",
        "",
        "`python -m bench.kafka_txns`: confluent-kafka (librdkafka) for every producing case, "
        "100-byte values, 4 partitions, replication 3, no fsync on either side; a fresh 3-node "
        "cluster of each broker. The goals compare each broker with itself.",
        "",
        "| measure | raftbroker | Apache Kafka | ratio |",
        "|---|---|---|---|",
    ]
    for label, _, digits in ROWS:
        a, b = ours["rows"][label], theirs["rows"][label]
        shown = "" if a is None or not b else number(a / b, 2)
        lines.append(f"| {label} | {number(a, digits)} | {number(b, digits)} | {shown} |")
    lines += [
        "",
        "| goal (issue 37) | bound | raftbroker | met | Apache Kafka |",
        "|---|---|---|---|---|",
    ]
    for label, name, _, bound in GOALS:
        a, b = ours["goals"][name], theirs["goals"][name]
        met = "not measured" if a["met"] is None else ("yes" if a["met"] else "**no**")
        lines.append(
            f"| {label} | {bound} | {number(a['ratio'], 3)} | {met} | {number(b['ratio'], 3)} |"
        )
    lines += [
        "",
        "A sequential transaction waits for each commit, so its records/s is bounded by the "
        "commit's round trips, not by the pipelined rate the first goal compares it with: "
        "bench/HISTORY.md (2026-11-29, sixth session) explains both goals' readings and where "
        "a commit's time goes.",
    ]
    return lines
