"""The state-machine walkthrough: the idempotent-producer stories, replayed on real replicas.

Three replicas of one partition apply the same log, exactly as Raft would hand it to them.
Each scene plays a story from the idempotent-producer literature (the lost acknowledgement,
the out-of-order send, the zombie producer), returns what each step produced and whether the
outcome is the one docs/semantics.md promises. Rendering is the caller's business.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

from cli.common import plural
from statemachine.commands import AppendBatch, InitTransactionalProducer, RegisterBroker
from statemachine.errors import Rejected
from statemachine.metadata import MetadataResult, MetadataStateMachine
from statemachine.partition import Appended, Duplicate, PartitionResult, PartitionStateMachine
from statemachine.records import Record, RecordBatch
from statemachine.txn_registry import ProducerIdAndEpoch


@dataclass(frozen=True, slots=True)
class Step:
    action: str
    outcome: str


@dataclass(slots=True)
class Scene:
    title: str
    story: str
    steps: list[Step] = field(default_factory=list)
    verdict: str = ""
    passed: bool = False


class ReplicatedPartition:
    """Three replicas fed the same committed entries; the first one's result is the answer."""

    def __init__(self) -> None:
        self.replicas = [PartitionStateMachine() for _ in range(3)]
        self.clock_ms = 1_700_000_000_000

    def append(self, batch: RecordBatch) -> PartitionResult:
        self.clock_ms += 7
        entry = AppendBatch(self.clock_ms, batch.encode()).encode()
        results = [replica.apply(entry) for replica in self.replicas]
        assert all(r == results[0] for r in results), "replicas disagree"
        return results[0]

    @property
    def log_end_offset(self) -> int:
        return self.replicas[0].log_end_offset

    def snapshot_digests(self) -> set[str]:
        return {hashlib.sha256(r.snapshot()).hexdigest()[:16] for r in self.replicas}


def describe(result: PartitionResult | MetadataResult) -> str:
    match result:
        case Appended(base_offset=base, last_offset=last):
            return f"appended at offsets {base}..{last}"
        case Duplicate(base_offset=base, last_offset=last):
            return f"duplicate: nothing appended, original offsets {base}..{last} returned"
        case Rejected(error=error):
            return f"rejected: {error.name}"
        case ProducerIdAndEpoch(producer_id=pid, epoch=epoch):
            return f"producer id {pid}, epoch {epoch}"
    return repr(result)


def payments(pid: int, epoch: int, base_seq: int, *amounts: int) -> RecordBatch:
    records = tuple(
        Record(b"merchant-42", f'{{"amount": {a}, "event": "{base_seq + i}"}}'.encode(), 1)
        for i, a in enumerate(amounts)
    )
    return RecordBatch(pid, epoch, base_seq, records)


def lost_ack_retry() -> Scene:
    scene = Scene(
        "The lost acknowledgement",
        "A producer sends a batch; it commits, but the acknowledgement is lost on the way back. "
        "The producer cannot tell a lost request from a lost reply, so it sends the same batch "
        "again with the same producer id, epoch and sequence.",
    )
    log = ReplicatedPartition()
    first = log.append(payments(7, 0, 0, 120, 80))
    scene.steps.append(Step("send batch seq 0-1 (ack lost)", describe(first)))
    retry = log.append(payments(7, 0, 0, 120, 80))
    scene.steps.append(Step("retry batch seq 0-1", describe(retry)))
    scene.passed = (
        isinstance(first, Appended)
        and retry == Duplicate(first.base_offset, first.last_offset, first.append_time_ms)
        and log.log_end_offset == 2
    )
    scene.verdict = (
        f"log holds {plural(log.log_end_offset, 'record')}: the payment was recorded once"
    )
    return scene


def out_of_order_send() -> Scene:
    scene = Scene(
        "The out-of-order send",
        "Five batches are in flight. Batch seq 2 fails and is retried, but batch seq 3 "
        "reaches the leader first. Accepting it would reorder the stream, so the broker "
        "refuses it until the gap is filled; the client then resends in order.",
    )
    log = ReplicatedPartition()
    steps = [("send seq 0", 0), ("send seq 1", 1), ("seq 3 arrives before seq 2", 3)]
    steps += [("retried seq 2 arrives", 2), ("resend seq 3", 3)]
    results = []
    for action, seq in steps:
        result = log.append(payments(9, 0, seq, 10 * (seq + 1)))
        results.append(result)
        scene.steps.append(Step(action, describe(result)))
    kinds = [type(r).__name__ for r in results]
    scene.passed = kinds == ["Appended", "Appended", "Rejected", "Appended", "Appended"]
    scene.verdict = f"log holds {plural(log.log_end_offset, 'record')} in sequence order 0,1,2,3"
    return scene


def zombie_fencing() -> Scene:
    scene = Scene(
        "The zombie producer",
        "Instance A of transactional id 'settlements' stalls in a long GC pause. The "
        "orchestrator starts instance B with the same transactional id. A wakes up and sends "
        "the batch it was holding: it must be fenced.",
    )
    metadata = MetadataStateMachine()
    metadata.apply(RegisterBroker(1, "127.0.0.2:9092", "127.0.0.2:9093").encode())
    log = ReplicatedPartition()

    def init(now_ms: int) -> MetadataResult:
        cmd = InitTransactionalProducer("settlements", 60_000, -1, -1, now_ms)
        return metadata.apply(cmd.encode())

    a = init(1_000)
    scene.steps.append(Step("instance A: InitProducerId", describe(a)))
    assert isinstance(a, ProducerIdAndEpoch)
    scene.steps.append(Step("A sends seq 0", describe(log.append(payments(*a, 0, 500)))))
    b = init(2_000)
    scene.steps.append(Step("instance B: InitProducerId (A paused)", describe(b)))
    assert isinstance(b, ProducerIdAndEpoch)
    b_send = log.append(payments(*b, 0, 700))
    scene.steps.append(Step("B sends seq 0", describe(b_send)))
    zombie = log.append(payments(*a, 1, 999))
    scene.steps.append(Step("A wakes, sends seq 1", describe(zombie)))
    scene.passed = (
        isinstance(b_send, Appended)
        and isinstance(zombie, Rejected)
        and zombie.error.name == "INVALID_PRODUCER_EPOCH"
        and log.log_end_offset == 2
    )
    scene.verdict = "the zombie's write never reached the log; B's epoch owns the producer id"
    return scene


def replicas_agree() -> Scene:
    scene = Scene(
        "Every replica agrees",
        "Apply is deterministic and pure: the same entries give byte-identical snapshots.",
    )
    log = ReplicatedPartition()
    for seq in range(0, 50, 5):
        log.append(payments(3, 0, seq, *range(5)))
    digests = log.snapshot_digests()
    scene.steps.append(Step("3 replicas apply 10 batches", f"snapshot digests: {sorted(digests)}"))
    scene.passed = len(digests) == 1
    scene.verdict = "one digest: any replica can take over as leader with identical windows"
    return scene


SCENES: tuple[Callable[[], Scene], ...] = (
    lost_ack_retry,
    out_of_order_send,
    zombie_fencing,
    replicas_agree,
)


def run() -> list[Scene]:
    return [make() for make in SCENES]
