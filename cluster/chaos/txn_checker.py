"""The chaos checker's transaction rules: Jepsen's Kafka anomalies, from a run's `txn`, `lso`,
`txn_read` and `ctp_committed` events (kafka_txns.py and native_txns.py write them).

Role: a pure function of the history, as checker.py, which calls it and reports its kinds.
The final read_committed reads (after healing, every transaction ended) are the authority:

- txn-lost: a value of a transaction whose commit was acknowledged is not in them;
- txn-aborted-read: a value of an aborted transaction (aborted on purpose and acknowledged,
  or certainly not committed) is in them, or a read_committed consumer read it (G1a);
- txn-torn: some values of a transaction are in them and others not (whatever its outcome);
- txn-duplicate: a value is in them twice;
- txn-dirty-read: a read_committed consumer read a value before its transaction's commit was
  even asked (it read past the last stable offset);
- lso-backwards: a partition's last stable offset, as its leaders answered it, went back;
- txn-hanging: once every transaction ended, a partition's last stable offset is still short
  of its high watermark (a transaction left open past its timeout holds it);
- txn-read-incomplete: a final read_committed read stopped short of its partition's end: the
  final-read checks above are not made then (they would report its missing values as lost);
- ctp-not-exactly-once: the consume-transform-produce output is not exactly one output
  (`output_of`) per input below the committed offsets, or holds an output of no committed
  input.
A value nobody wrote, in a final read, is `unexpected`, as in the rest of the checker.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cluster.chaos.history import Event

TXN_KINDS = (
    "txn-lost",
    "txn-aborted-read",
    "txn-torn",
    "txn-duplicate",
    "txn-dirty-read",
    "lso-backwards",
    "txn-hanging",
    "ctp-not-exactly-once",
    "txn-read-incomplete",
)
Add = Callable[[str, int | None, str], None]
_BY = " by "


def output_of(value: str, txn: str) -> str:
    """What the processor writes for input `value` in transaction `txn`: each output names its
    input and its transaction, so that every value of the run is written once."""
    return f"o-{value}{_BY}{txn}"


def input_of(output: str) -> str:
    """The input an output (`output_of`) was made of."""
    return output.removeprefix("o-").rsplit(_BY, 1)[0]


@dataclass(slots=True)
class _Txn:
    process: str
    topic: str
    values: list[tuple[int, str]]
    intent: str
    inputs: list[tuple[int, int, str]] = field(default_factory=list)
    read_ms: float = 0.0
    outcome: str = "info"  # until an outcome arrives: unknown
    ending_ms: float | None = None

    @property
    def committed(self) -> bool:
        return self.outcome == "ok" and self.intent == "commit"

    @property
    def aborted(self) -> bool:
        return self.outcome == "fail" or (self.outcome == "ok" and self.intent == "abort")


@dataclass(slots=True)
class _Reads:
    """The final reads: (topic, isolation) -> partition -> [(offset, value)]."""

    rows: dict[tuple[str, str], dict[int, list[tuple[int, str]]]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    incomplete: list[tuple[str, int]] = field(default_factory=list)  # read_committed ones

    def committed(self, topic: str) -> list[tuple[int, int, str]]:
        """(partition, offset, value) of a topic's read_committed read."""
        by_partition = self.rows.get((topic, "read_committed"), {})
        return [(p, o, v) for p, rows in sorted(by_partition.items()) for o, v in rows]


def check_transactions(events: Sequence[Event], add: Add) -> dict[str, Any]:
    """Add every transaction anomaly of the history; the figures of its transactions."""
    txns, reads, lsos, committed_offsets = _index(events)
    if not txns and not reads.rows:
        return {}
    owner = {value: txn_id for txn_id, t in txns.items() for _, value in t.values}
    visible: dict[str, set[str]] = {}
    for topic, partition in reads.incomplete:
        add("txn-read-incomplete", partition, f"{topic}: the final read stopped short")
    if not reads.incomplete:
        visible = _check_final_reads(txns, reads, owner, add)
        _check_outcomes(txns, visible, add)
        _check_processor(txns, reads, committed_offsets, add)
    _check_reads_during_run(txns, owner, add)
    _check_lsos(lsos, add)
    outcomes = Counter(
        "committed" if t.committed else "aborted" if t.aborted else "unknown" for t in txns.values()
    )
    return {
        "transactions": dict(sorted(outcomes.items())),
        "client_hangs": sum(1 for e in events if e.f == "client_hang"),
        "processor_transactions": sum(1 for t in txns.values() if t.inputs),
        "committed_values_read": sum(len(v) for v in visible.values()),
    }


def _index(
    events: Sequence[Event],
) -> tuple[dict[str, _Txn], _Reads, list[Event], dict[int, int] | None]:
    txns: dict[str, _Txn] = {}
    reads = _Reads()
    lsos: list[Event] = []
    committed_offsets: dict[int, int] | None = None
    for e in sorted(events, key=lambda e: e.time_ms):
        if e.f == "txn" and e.type == "invoke":
            txns[e.get("txn")] = _Txn(
                e.process,
                e.get("topic"),
                [(int(p), str(v)) for p, v in e.get("values")],
                e.get("intent"),
                [(int(p), int(o), str(v)) for p, o, v in e.get("inputs", [])],
                float(e.get("read_ms", 0.0)),
            )
        elif e.f == "txn" and e.get("txn") in txns:
            txn = txns[e.get("txn")]
            txn.outcome, txn.ending_ms = e.type, e.get("ending_ms")
        elif e.f == "txn_read":
            rows = [(int(r[0]), str(r[1])) for r in e.get("records")]
            reads.rows[(e.get("topic"), e.get("isolation"))][int(e.get("partition"))] = rows
            if e.get("isolation") == "read_committed" and not e.get("complete"):
                reads.incomplete.append((e.get("topic"), int(e.get("partition"))))
        elif e.f == "lso":
            lsos.append(e)
        elif e.f == "ctp_committed":
            committed_offsets = {int(p): int(o) for p, o in e.get("offsets")}
    return txns, reads, lsos, committed_offsets


def _check_final_reads(
    txns: dict[str, _Txn], reads: _Reads, owner: dict[str, str], add: Add
) -> dict[str, set[str]]:
    """Duplicates and strangers in the read_committed reads; txn id -> its values read."""
    visible: dict[str, set[str]] = defaultdict(set)
    topics = {topic for topic, isolation in reads.rows if isolation == "read_committed"}
    for topic in sorted(topics):
        seen: Counter[str] = Counter()
        for partition, offset, value in reads.committed(topic):
            seen[value] += 1
            if seen[value] == 2:
                add("txn-duplicate", partition, f"{topic}: {value!r} again at {offset}")
            txn_id = owner.get(value)
            if txn_id is None:
                add("unexpected", partition, f"{topic}: {value!r} at {offset}, written by none")
            elif txns[txn_id].topic == topic:
                visible[txn_id].add(value)
    return visible


def _check_outcomes(txns: dict[str, _Txn], visible: dict[str, set[str]], add: Add) -> None:
    for txn_id, txn in sorted(txns.items()):
        seen = visible.get(txn_id, set())
        values = {v for _, v in txn.values}
        if txn.committed:
            for partition, value in txn.values:
                if value not in seen:
                    add("txn-lost", partition, f"{txn_id}: committed {value!r} not read")
        if txn.aborted and seen:
            add("txn-aborted-read", None, f"{txn_id} ({txn.outcome}): {sorted(seen)} read")
        if seen and seen != values:
            add(
                "txn-torn",
                None,
                f"{txn_id} ({txn.outcome}): only {sorted(seen)} of {sorted(values)}",
            )


def _check_reads_during_run(txns: dict[str, _Txn], owner: dict[str, str], add: Add) -> None:
    """What the processor's read_committed consumer read, when it read it."""
    for txn_id, txn in sorted(txns.items()):
        for partition, offset, value in txn.inputs:
            source = txns.get(owner.get(value, ""))
            if source is None:
                continue  # a stranger: the final reads report it
            if source.aborted:
                add("txn-aborted-read", partition, f"{txn_id} read {value!r} ({offset}): aborted")
            if source.ending_ms is None or txn.read_ms < source.ending_ms:
                add(
                    "txn-dirty-read",
                    partition,
                    f"{txn_id} read {value!r} at {txn.read_ms} ms, its commit asked at "
                    f"{source.ending_ms} ms",
                )


def _check_lsos(lsos: list[Event], add: Add) -> None:
    last: dict[tuple[str, int], int] = {}
    for e in lsos:
        key = (e.get("topic"), int(e.get("partition")))
        lso, hw = int(e.get("lso")), int(e.get("hw"))
        if lso < last.get(key, 0):
            add("lso-backwards", key[1], f"{key[0]}: {last[key]} then {lso} at {e.time_ms} ms")
        last[key] = max(last.get(key, 0), lso)
        if e.get("final") and lso < hw:
            add("txn-hanging", key[1], f"{key[0]}: last stable offset {lso}, end {hw}")


def _check_processor(
    txns: dict[str, _Txn], reads: _Reads, committed: dict[int, int] | None, add: Add
) -> None:
    """Exactly one output per input below the committed offsets, none of anything else."""
    processors = {t.process for t in txns.values() if t.inputs}
    if committed is None or not processors:
        return
    outputs = Counter(input_of(value) for _, _, value in _processor_outputs(txns, reads))
    inputs = {
        value: (partition, offset)
        for topic in {t.topic for t in txns.values() if not t.inputs}
        for partition, offset, value in reads.committed(topic)
    }
    for value, (partition, offset) in sorted(inputs.items()):
        if partition not in committed:
            continue  # its committed offset could not be read: nothing to judge it by
        count = outputs.get(value, 0)
        consumed = offset < committed[partition]
        if count != int(consumed):
            add(
                "ctp-not-exactly-once",
                partition,
                f"{value!r} at {offset} ({'below' if consumed else 'past'} the committed "
                f"offset {committed.get(partition, 0)}): {count} outputs",
            )
    for source in sorted(outputs):
        if source not in inputs:
            add("ctp-not-exactly-once", None, f"an output of {source!r}, no committed input")


def _processor_outputs(txns: dict[str, _Txn], reads: _Reads) -> list[tuple[int, int, str]]:
    topics = {t.topic for t in txns.values() if t.inputs}
    return [row for topic in sorted(topics) for row in reads.committed(topic)]
