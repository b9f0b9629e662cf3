"""A chaos run's verdict: the anomalies found, by kind (`KINDS`, in the order the summary
lists them; checker.py says what each means), at most `EXAMPLES_MAX` examples of each kept,
and the run's figures, as JSON and as the summary a person reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cluster.chaos.txn_checker import TXN_KINDS

KINDS = (
    "lost",
    "duplicate",
    "inconsistent-offset",
    "ack-mismatch",
    "unexpected",
    "aborted-read",
    "producer-order",
    "consumer-order",
    "replica-divergence",
    "raft-applied-truncation",
    "fenced-write",
    "client-error",
    "group-owned-twice",
    "group-commit-backwards",
    "group-lost",
    "group-order",
    *TXN_KINDS,
)


@dataclass(frozen=True, slots=True)
class Anomaly:
    kind: str
    partition: int | None
    detail: str


@dataclass(frozen=True, slots=True)
class Report:
    anomalies: tuple[Anomaly, ...]
    counts_by_kind: dict[str, int]
    figures: dict[str, Any]

    @property
    def ok(self) -> bool:
        return not any(self.counts_by_kind.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "anomalies_by_kind": self.counts_by_kind,
            "anomaly_examples": [
                {"kind": a.kind, "partition": a.partition, "detail": a.detail}
                for a in self.anomalies
            ],
            "figures": self.figures,
        }

    def summary(self) -> str:
        f = self.figures
        ops = f["operations"]
        lines = [
            "verdict: " + ("no anomalies" if self.ok else "ANOMALIES FOUND"),
            f"sends: {ops['attempted']} attempted, {ops['ok']} ok, {ops['fail']} failed, "
            f"{ops['info']} indeterminate; {f['retries']} retries, {f['dedup_hits']} dedup hits",
            *_failed_lines(f["failed_by_error"]),
            f"records in the final logs: {sum(f['final_records'].values())} "
            f"over {f['partitions_checked']} partitions",
            "faults: " + (", ".join(f"{k} x{v}" for k, v in sorted(f["faults"].items())) or "none"),
            f"kill to next ack: median {_ms(f['recovery_ms']['median'])}, "
            f"max {_ms(f['recovery_ms']['max'])} over {f['recovery_ms']['count']} kills",
            "longest write gap per partition: "
            + ", ".join(f"{p}: {_ms(g)}" for p, g in sorted(f["longest_write_gap_ms"].items())),
        ]
        group = f.get("group")
        if group is not None:
            c = group["commits"]
            lines.append(
                f"consumer group: {group['members']} members, {group['generations']} "
                f"generations, {group['records_read']} records read ({group['read_again']} "
                f"again after a rebalance), commits {c['ok']} ok, {c['fail']} refused "
                f"(rebalanced), {c['info']} unknown; "
                + ("read to the end" if group["drained"] else "NOT read to the end")
            )
        client = f["client"]
        if any(client.values()):
            lines.append(
                f"Kafka clients: {client['errors']} errors reported ({client['fatal']} fatal), "
                f"{client['log_lines']} log lines"
            )
        for kind in KINDS:
            count = self.counts_by_kind[kind]
            lines.append(f"  {kind:<20} {count}")
            examples = [a for a in self.anomalies if a.kind == kind][:3]
            lines += [f"      {_where(a.partition)}: {a.detail}" for a in examples]
        return "\n".join(lines)


# Why a send failed for certain, as the summary explains it: the workload's replaced
# transactional producer (a zombie) tries one send to every partition, which must be fenced.
FAILURE_REASONS = {
    "INVALID_PRODUCER_EPOCH": "a replaced transactional producer (a zombie) fenced: expected",
    "PRODUCER_FENCED": "a replaced transactional producer (a zombie) fenced: expected",
}


def _failed_lines(failed_by_error: dict[str, int]) -> list[str]:
    """One line per error that made sends fail, with what it means."""
    return [
        f"  failed: {error} x{count} ({FAILURE_REASONS.get(error, 'refused by the broker')})"
        for error, count in sorted(failed_by_error.items())
    ]


def _where(partition: int | None) -> str:
    return "client" if partition is None else f"p{partition}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"
