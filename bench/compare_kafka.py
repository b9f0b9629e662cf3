"""raftbroker against Apache Kafka: the figures `bench.kafka` and `bench.groups` report for each
broker, the goals of issue 36 as ratios of raftbroker's figure to Kafka's, and their table.

Role: pure functions from the reports to figures, verdicts and the markdown section that opens
RESULTS.md (`bench.compare` puts it in the combined report); no I/O. A figure a side did not
produce is None and its goal "not measured", never a guess.
"""

from __future__ import annotations

from typing import Any

from bench.report import Goals, cpu_text, dig, goal, goal_cells, group_figures, number, ratio

# Issue 36: the same workloads (bench.kafka, bench.groups) against raftbroker's Kafka listener
# and against Apache Kafka itself (3 KRaft nodes).
GOALS_VS_KAFKA: Goals = {
    "kafka_pipelined": ("pipelined acked records/s, 1 partition (kcat)", 1.0, "min"),
    "kafka_pipelined_16": ("pipelined acked records/s, 16 partitions (kcat)", 1.0, "min"),
    "kafka_consume": ("consume records/s, 1 partition (kcat)", 1.0, "min"),
    "kafka_sequential_p50": ("sequential p50, ms (confluent-kafka, rounds)", 1.0, "max"),
    "kafka_e2e_p99": ("end-to-end p99 at 1,000 records/s, ms", 1.0, "max"),
    "kafka_failover": ("failover: leader SIGKILL -> next ack, ms (p50)", 0.3, "max"),
    "kafka_fsync_pipelined": ("with fsync: pipelined acked records/s, 1 partition", 1.0, "min"),
    "kafka_idle_cpu": ("idle CPU, 1,000 partitions (waits for issue 38)", 1.0, "max"),
}  # fmt: skip

# The table: (label, figure, digits); the rows with a goal show its verdict.
KAFKA_ROWS = (
    ("pipelined, acked records/s, 1 partition (kcat)", "kafka_pipelined", 0),
    ("pipelined, acked records/s, 16 partitions (kcat)", "kafka_pipelined_16", 0),
    ("consume from the start, records/s, 1 partition (kcat)", "kafka_consume", 0),
    ("consume from the start, records/s, 16 partitions (kcat)", "kafka_consume_16", 0),
    ("sequential p50, ms (confluent-kafka, median of the rounds)", "kafka_sequential_p50", 2),
    ("sequential p99, ms (confluent-kafka, scenario run)", "kafka_sequential_p99", 2),
    ("end-to-end p50 at 1,000 records/s, ms (confluent-kafka)", "kafka_e2e_p50", 2),
    ("end-to-end p99 at 1,000 records/s, ms (confluent-kafka)", "kafka_e2e_p99", 2),
    ("failover: leader SIGKILL -> next ack, ms (p50 of the kills)", "kafka_failover", 0),
    ("with fsync on both: pipelined acked records/s (kcat)", "kafka_fsync_pipelined", 0),
    ("with fsync on both: sequential p50, ms (confluent-kafka)", "kafka_fsync_sequential_p50", 2),
    ("consumer group of 3 (librdkafka, 4 partitions), records/s", "groups_consume", 0),
    ("consumer group: member SIGKILL -> its partitions read again, s", "groups_takeover_median", 2),
    ("idle, 1,000 partitions: CPU of the 3 nodes, % of one core", "kafka_idle_cpu", 1),
    ("idle, 1,000 partitions: resident memory, MB per node", "kafka_idle_rss_mb", 0),
    ("pipelined + consume: peak resident memory, MB per node", "kafka_peak_rss_mb", 0),
    ("Kafka's ProducerPerformance: acked records/s, 1 partition", "tools_producer", 0),
    ("Kafka's ProducerPerformance: p99 latency, ms", "tools_producer_p99", 0),
    ("Kafka's ConsumerPerformance: records/s (fetch time)", "tools_consumer", 0),
    ("Kafka's EndToEndLatency: p50, ms (whole ms)", "tools_e2e_p50", 0),
    ("Kafka's EndToEndLatency: p99, ms (whole ms)", "tools_e2e_p99", 0),
)  # fmt: skip


def largest_node(memory: dict[str, Any] | None, key: str) -> float | None:
    """The largest of the nodes' figure `key` in a `bench.harness.memory_mb` report."""
    values = [v[key] for v in (memory or {}).values()]
    return max(values, default=None)


def kafka_figures(kafka: dict[str, Any]) -> dict[str, Any]:
    """bench.kafka's figures (of either broker)."""

    def case(section: str, partitions: int) -> dict[str, Any]:
        cases = dig(kafka, section, "cases") or []
        return next((c for c in cases if c["partitions"] == partitions), {})

    tools = dig(kafka, "tools") or {}
    return {
        "kafka_pipelined": case("pipelined", 1).get("records_per_s"),
        "kafka_pipelined_16": case("pipelined", 16).get("records_per_s"),
        "kafka_sequential_p50": dig(kafka, "sequential", "p50_ms"),
        "kafka_sequential_p99": dig(kafka, "sequential", "p99_ms"),
        "kafka_consume": case("consume", 1).get("records_per_s"),
        "kafka_consume_16": case("consume", 16).get("records_per_s"),
        "kafka_pipelined_cpu": case("pipelined", 1).get("cpu"),
        "kafka_failover": dig(kafka, "failover", "p50_ms"),
        "kafka_e2e_p50": dig(kafka, "e2e", "p50_ms"),
        "kafka_e2e_p99": dig(kafka, "e2e", "p99_ms"),
        "kafka_fsync_pipelined": dig(kafka, "fsync", "pipelined", "records_per_s"),
        "kafka_fsync_sequential_p50": dig(kafka, "fsync", "sequential", "p50_ms"),
        "kafka_idle_cpu": dig(kafka, "idle", "cpu_percent_total"),
        "kafka_idle_rss_mb": largest_node(dig(kafka, "idle", "memory"), "rss_mb"),
        "kafka_peak_rss_mb": largest_node(case("pipelined", 1).get("memory"), "peak_rss_mb"),
        "tools_producer": dig(tools, "producer_performance", "records_per_s"),
        "tools_producer_p99": dig(tools, "producer_performance", "p99_ms"),
        "tools_consumer": dig(tools, "consumer_performance", "fetch_records_per_s"),
        "tools_e2e_p50": dig(tools, "end_to_end_latency", "p50_ms"),
        "tools_e2e_p99": dig(tools, "end_to_end_latency", "p99_ms"),
    }


def apache_figures(apache: dict[str, Any], groups: dict[str, Any]) -> dict[str, Any]:
    """Apache Kafka's figures: bench.kafka's against it, and its consumer group's."""
    return kafka_figures(apache) | group_figures(groups, "apache_kafka")


def goals_vs_kafka(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    return {name: goal(name, ours[name], theirs[name], GOALS_VS_KAFKA) for name in GOALS_VS_KAFKA}


def kafka_table(c: dict[str, Any]) -> list[str]:
    """Apache Kafka, the first peer: the same workloads against both brokers."""
    a, k, goals = c["raftbroker"], c["apache_kafka"], c["goals_vs_kafka"]
    cluster = dig(c, "versions", "apache_kafka") or {}
    lines = [
        "## raftbroker vs Apache Kafka",
        "",
        f"- Apache Kafka {cluster.get('kafka', '?')} ({cluster.get('mode', '?')}; "
        f"{cluster.get('java', '?')}, heap {cluster.get('heap_mb', '?')} MB per node, "
        f"jars: {cluster.get('jars', '?')}); replication {cluster.get('replication', '?')}, "
        f"`min.insync.replicas` {cluster.get('min.insync.replicas', '?')}, "
        f"`log.flush.interval.messages` {cluster.get('log.flush.interval.messages', '?')} "
        "(1 in the fsync rows: every append fsynced on leader and followers before an "
        "`acks=all` answer).",
        "- raftbroker: the same 3 nodes as below, through its Kafka listener, fsync = false "
        "(as Kafka's default, acknowledged from the page cache of a majority; `fsync = true`, "
        "its own default, in the fsync rows).",
        "- The same client settings on both: librdkafka, `acks=all`, idempotence on, "
        "`linger.ms` 5, 100-byte values, replication 3 (`python -m bench.kafka --broker ...`); "
        "Kafka's own tools with the same settings (`bench.kafka_tools`), one JVM each.",
        "",
        "| measure | raftbroker | Apache Kafka | ratio | goal | met |",
        "|---|---|---|---|---|---|",
    ]
    for label, key, digits in KAFKA_ROWS:
        verdict = goals.get(key)
        target, met = goal_cells(GOALS_VS_KAFKA, key, verdict)
        shown = ratio(a.get(key), k.get(key)) if verdict is None else verdict["ratio"]
        lines.append(
            f"| {label} | {number(a.get(key), digits)} | {number(k.get(key), digits)} | "
            f"{'' if shown is None else number(shown, 2)} | {target} | {met} |"
        )
    lines += [
        "",
        "CPU during the 1-partition pipelined run: raftbroker "
        f"{cpu_text(a.get('kafka_pipelined_cpu'))}; Apache Kafka "
        f"{cpu_text(k.get('kafka_pipelined_cpu'))}.",
    ]
    return lines
