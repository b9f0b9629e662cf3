"""A real PartitionStateMachine agrees with a reference model of docs/semantics.md's validation.

The model below is written from docs/semantics.md ("Batch validation", "Expiry", "Limits"), not
from `statemachine/producer_state.py`: per producer id it keeps the epoch, the stamped time of
the last accepted batch and a window of the last 5 accepted batches, and it decides each batch
by rules 1-7 in their order; a new producer that finds the table full evicts the producer with
the smallest (last stamped time, producer id). Each run draws the table's capacity, from 1
(every newcomer evicts) to more than the run's producers (no eviction). A Hypothesis rule-based
state machine then drives the real partition with encoded log entries (`AppendBatch`,
`ExpireProducers`) from a few producers: contiguous batches, retries of batches of any age (the
6th-oldest and older must be out of order), gaps, reorders, partial overlaps, epoch bumps (from
0 and not from 0), fenced lower epochs, producers that start just below the 2^31-1 sequence
wrap, non-idempotent batches, time passing (or not: equal stamped times test the tie-break) and
expiry (including the exact `now - last >= expiration` boundary), and producers evicted from a
full table and coming back.

What it proves, after every step of every generated run:
- the real result equals the model's exactly (same result type, offsets, append time, error
  code, expired producer ids);
- a duplicate returns the offsets the original append returned (checked against the recorded
  real result, independently of the model);
- the next contiguous batch of a well-behaved producer is always accepted;
- the log end offset equals the number of records accepted, and a duplicate or a rejection
  never moves it (S22);
- the real producer table (epoch, last timestamp, window) equals the model's.

Leader-stamped time only moves forward here, as one leader's clock does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from statemachine.commands import AppendBatch, ExpireProducers
from statemachine.errors import ErrorCode, Rejected
from statemachine.limits import DEFAULT_LIMITS, StateLimits
from statemachine.partition import (
    Appended,
    Duplicate,
    PartitionResult,
    PartitionStateMachine,
    ProducersExpired,
)
from statemachine.records import Record, RecordBatch

# -- the reference model, from docs/semantics.md --------------------------------------------------

SEQ_MAX = 2**31 - 1  # the largest sequence; the one after it is 0
EPOCH_MAX = 2**15 - 1
WINDOW_SIZE = 5
NON_IDEMPOTENT = -1


def seq_add(sequence: int, delta: int) -> int:
    """`sequence + delta` on the sequence circle 0 .. 2^31-1."""
    return (sequence + delta) % (SEQ_MAX + 1)


def follows(last_seq: int, base_seq: int) -> bool:
    """Rule 5: `base_seq` continues a session whose last sequence is `last_seq`."""
    if last_seq == SEQ_MAX:
        return base_seq == 0
    return base_seq == last_seq + 1


@dataclass(frozen=True)
class SentBatch:
    """What a producer put on the wire: enough to rebuild the exact batch bytes."""

    producer_id: int
    epoch: int
    base_seq: int
    count: int

    @property
    def last_seq(self) -> int:
        return seq_add(self.base_seq, self.count - 1)

    def encode(self, timestamp_ms: int) -> bytes:
        records = tuple(
            Record(b"k%d" % i, b"v" * (i + 1), timestamp_ms, (("h", b"%d" % self.base_seq),))
            for i in range(self.count)
        )
        return RecordBatch(self.producer_id, self.epoch, self.base_seq, records).encode()


@dataclass(frozen=True)
class Retained:
    """One window entry, as docs/semantics.md's "Window" term lists its fields."""

    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int
    timestamp_ms: int


@dataclass
class ModelProducer:
    epoch: int
    last_timestamp_ms: int
    window: list[Retained] = field(default_factory=list)


class Model:
    """The applied state of one partition, reduced to what the validation rules need."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.producers: dict[int, ModelProducer] = {}
        self.log_end_offset = 0
        self.evicted: list[int] = []

    def append(self, batch: SentBatch, data: bytes, now_ms: int) -> PartitionResult:
        producer = self.producers.get(batch.producer_id)
        if batch.producer_id != NON_IDEMPOTENT and producer is not None:
            if batch.epoch == producer.epoch:  # rule 2: exactly a retained batch
                for kept in producer.window:
                    if (kept.first_seq, kept.last_seq) == (batch.base_seq, batch.last_seq):
                        return Duplicate(kept.base_offset, kept.last_offset, kept.timestamp_ms)
            if batch.epoch < producer.epoch:  # rule 3: fenced
                return Rejected(ErrorCode.INVALID_PRODUCER_EPOCH)
            if batch.epoch > producer.epoch and batch.base_seq != 0:  # rule 4
                return Rejected(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
            if batch.epoch == producer.epoch and not follows(
                producer.window[-1].last_seq, batch.base_seq
            ):  # rule 5
                return Rejected(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
        # rule 1 (unknown producer: any sequence), rule 6 (accept), rule 7 (no producer id)
        base_offset = self.log_end_offset
        last_offset = base_offset + batch.count - 1
        self.log_end_offset = last_offset + 1
        if batch.producer_id != NON_IDEMPOTENT:
            if producer is None and len(self.producers) == self.capacity:  # "Limits": evict
                victim = min(self.producers, key=lambda p: (self.producers[p].last_timestamp_ms, p))
                del self.producers[victim]
                self.evicted.append(victim)
            if producer is None or batch.epoch > producer.epoch:
                producer = ModelProducer(batch.epoch, now_ms)
                self.producers[batch.producer_id] = producer
            producer.window.append(
                Retained(batch.base_seq, batch.last_seq, base_offset, last_offset, now_ms)
            )
            if len(producer.window) > WINDOW_SIZE:
                producer.window.pop(0)  # the oldest is evicted first
            producer.last_timestamp_ms = now_ms
        return Appended(base_offset, last_offset, now_ms, data)

    def expire(self, now_ms: int, expiration_ms: int) -> ProducersExpired:
        gone = sorted(
            pid
            for pid, producer in self.producers.items()
            if now_ms - producer.last_timestamp_ms >= expiration_ms
        )
        for pid in gone:
            del self.producers[pid]
        return ProducersExpired(tuple(gone))

    def table(self) -> list[tuple[int, int, int, list[tuple[int, int, int, int, int]]]]:
        return [
            (
                pid,
                p.epoch,
                p.last_timestamp_ms,
                [
                    (k.first_seq, k.last_seq, k.base_offset, k.last_offset, k.timestamp_ms)
                    for k in p.window
                ],
            )
            for pid, p in sorted(self.producers.items())
        ]


def assert_same(actual: PartitionResult, expected: PartitionResult) -> None:
    """Equal and of the same class (NamedTuples of equal fields compare equal across classes)."""
    assert type(actual) is type(expected), (actual, expected)
    assert actual == expected, (actual, expected)


# -- the client side ------------------------------------------------------------------------------


@dataclass
class Client:
    """A producer's own view of its session: what a well-behaved client sends next."""

    producer_id: int
    epoch: int
    next_seq: int
    sent: list[SentBatch] = field(default_factory=list)


PICK = st.integers(0, 2**16)  # an index, reduced modulo the list it picks from
COUNT = st.integers(1, 5)
FIRST_PID = 1_000
MAX_PRODUCERS = 6


@settings(max_examples=250, stateful_step_count=50, deadline=None)
class ProducerTableMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.real = PartitionStateMachine()
        self.model = Model(DEFAULT_LIMITS.producers_per_partition_max)
        self.now_ms = 1_000
        self.clients: list[Client] = []
        self.records_accepted = 0
        # (pid, epoch, first_seq, last_seq) -> the real result of its latest append
        self.appended: dict[tuple[int, int, int, int], Appended] = {}

    # -- helpers ----------------------------------------------------------------------------------

    def _client(self, pick: int) -> Client:
        return self.clients[pick % len(self.clients)]

    def _add_client(self, epoch: int, next_seq: int) -> Client:
        client = Client(FIRST_PID + len(self.clients), epoch, next_seq)
        self.clients.append(client)
        return client

    def _send(self, batch: SentBatch, label: str) -> PartitionResult:
        data = batch.encode(self.now_ms)
        before = self.real.log_end_offset
        expected = self.model.append(batch, data, self.now_ms)
        actual = self.real.apply(AppendBatch(self.now_ms, data).encode())
        event(f"{label}: {type(actual).__name__}")
        assert_same(actual, expected)
        key = (batch.producer_id, batch.epoch, batch.base_seq, batch.last_seq)
        if isinstance(actual, Appended):
            assert actual.base_offset == before
            assert actual.last_offset == before + batch.count - 1
            assert self.real.log_end_offset == before + batch.count
            self.records_accepted += batch.count
            self.appended[key] = actual
            if batch.producer_id != NON_IDEMPOTENT:
                client = self._client(batch.producer_id - FIRST_PID)
                client.epoch, client.next_seq = batch.epoch, seq_add(batch.last_seq, 1)
        else:
            # S22: duplicates and rejections do not move the log end offset
            assert self.real.log_end_offset == before
        if isinstance(actual, Duplicate):
            # S1: the *original* offsets, as the real machine returned them then
            original = self.appended[key]
            assert actual == (original.base_offset, original.last_offset, original.append_time_ms)
        if batch.producer_id != NON_IDEMPOTENT:
            self._client(batch.producer_id - FIRST_PID).sent.append(batch)
        return actual

    # -- rules ------------------------------------------------------------------------------------

    @initialize(
        epochs=st.lists(st.integers(0, 4), min_size=2, max_size=3),
        capacity=st.integers(1, MAX_PRODUCERS + 1),
    )
    def start_producers(self, epochs: list[int], capacity: int) -> None:
        self.real = PartitionStateMachine(StateLimits(producers_per_partition_max=capacity))
        self.model = Model(capacity)
        event(f"table capacity {capacity}")
        for epoch in epochs:
            self._add_client(epoch, 0)

    @rule(who=PICK, counts=st.lists(COUNT, min_size=1, max_size=7))
    def produce(self, who: int, counts: list[int]) -> None:
        """A well-behaved producer's next batches: always accepted (rules 1, 5, 6)."""
        client = self._client(who)
        for count in counts:
            batch = SentBatch(client.producer_id, client.epoch, client.next_seq, count)
            assert isinstance(self._send(batch, "next batch"), Appended)

    @rule(who=PICK, age=PICK)
    def retry(self, who: int, age: int) -> None:
        """Resend one of this producer's earlier batches, of any age and any outcome."""
        client = self._client(who)
        if client.sent:
            batch = client.sent[-1 - age % len(client.sent)]
            where = self._age_in_session(batch)
            result = self._send(batch, "retry")
            event(f"retry of a batch {where}: {type(result).__name__}")

    def _age_in_session(self, batch: SentBatch) -> str:
        """For the statistics only: where the real table's current session had this batch."""
        entry = self.real.producers.get(batch.producer_id)
        if entry is None and batch.producer_id in self.model.evicted:
            return "of an evicted producer"
        if entry is None or entry.epoch != batch.epoch:
            return "of another session"
        ranges = [(m.first_seq, m.last_seq) for m in entry.window]
        if (batch.base_seq, batch.last_seq) in ranges:
            return f"{len(ranges) - ranges.index((batch.base_seq, batch.last_seq))} back"
        key = (batch.producer_id, batch.epoch, batch.base_seq, batch.last_seq)
        return "evicted" if key in self.appended else "never appended"

    @rule(who=PICK, gap=st.integers(1, 1_000), count=COUNT)
    def gap(self, who: int, gap: int, count: int) -> None:
        client = self._client(who)
        self._send(
            SentBatch(client.producer_id, client.epoch, seq_add(client.next_seq, gap), count),
            "gap",
        )

    @rule(who=PICK, back=st.integers(1, 30), count=COUNT)
    def reorder(self, who: int, back: int, count: int) -> None:
        client = self._client(who)
        self._send(
            SentBatch(client.producer_id, client.epoch, seq_add(client.next_seq, -back), count),
            "reorder",
        )

    @rule(who=PICK, age=PICK, shift=st.integers(-3, 3), grow=st.integers(-3, 3))
    def overlap(self, who: int, age: int, shift: int, grow: int) -> None:
        """A batch overlapping an earlier one: partly, or (shift = grow = 0) exactly."""
        client = self._client(who)
        if client.sent:
            old = client.sent[-1 - age % len(client.sent)]
            count = max(1, old.count + grow)
            batch = SentBatch(old.producer_id, old.epoch, seq_add(old.base_seq, shift), count)
            self._send(batch, "overlap")

    @rule(
        who=PICK,
        step=st.integers(1, 3),
        base=st.one_of(st.just(0), st.integers(1, SEQ_MAX)),
        count=COUNT,
    )
    def bump_epoch(self, who: int, step: int, base: int, count: int) -> None:
        client = self._client(who)
        epoch = min(client.epoch + step, EPOCH_MAX)
        if epoch > client.epoch:
            self._send(SentBatch(client.producer_id, epoch, base, count), f"bump base={base > 0}")

    @rule(who=PICK, below=st.integers(1, 3), count=COUNT)
    def lower_epoch(self, who: int, below: int, count: int) -> None:
        """A fenced instance whose sequence would otherwise fit."""
        client = self._client(who)
        if client.epoch > 0:
            epoch = max(0, client.epoch - below)
            self._send(SentBatch(client.producer_id, epoch, client.next_seq, count), "lower epoch")

    @precondition(lambda self: len(self.clients) < MAX_PRODUCERS)
    @rule(below_wrap=st.integers(0, 6), epoch=st.integers(0, 2), count=COUNT)
    def start_near_wrap(self, below_wrap: int, epoch: int, count: int) -> None:
        """A new producer id starting at SEQ_MAX - below_wrap: its batches cross the wrap."""
        client = self._add_client(epoch, SEQ_MAX - below_wrap)
        batch = SentBatch(client.producer_id, epoch, client.next_seq, count)
        assert isinstance(self._send(batch, "near wrap"), Appended)

    @rule(count=COUNT)
    def non_idempotent(self, count: int) -> None:
        batch = SentBatch(NON_IDEMPOTENT, NON_IDEMPOTENT, NON_IDEMPOTENT, count)
        assert isinstance(self._send(batch, "no producer id"), Appended)

    @rule(delta_ms=st.integers(0, 3_000))
    def advance_time(self, delta_ms: int) -> None:
        self.now_ms += delta_ms

    def _expire(self, expiration_ms: int) -> None:
        expected = self.model.expire(self.now_ms, expiration_ms)
        before = self.real.log_end_offset
        actual = self.real.apply(ExpireProducers(self.now_ms, expiration_ms).encode())
        event(f"expire: {len(expected.producer_ids)} expired")
        assert_same(actual, expected)
        assert self.real.log_end_offset == before

    @rule(expiration_ms=st.integers(1, 6_000))
    def expire(self, expiration_ms: int) -> None:
        self._expire(expiration_ms)

    @rule(who=PICK, off_by=st.integers(-1, 1))
    def expire_at_the_boundary(self, who: int, off_by: int) -> None:
        """Expiration exactly `now - last` (expires), one less (expires), one more (stays)."""
        producer = self.model.producers.get(self._client(who).producer_id)
        if producer is not None:
            expiration_ms = self.now_ms - producer.last_timestamp_ms + off_by
            if expiration_ms >= 1:
                self._expire(expiration_ms)

    # -- invariants -------------------------------------------------------------------------------

    @invariant()
    def log_end_offset_counts_accepted_records(self) -> None:
        assert self.real.log_end_offset == self.model.log_end_offset == self.records_accepted

    @invariant()
    def producer_table_matches_the_model(self) -> None:
        real = [
            (pid, e.epoch, e.last_timestamp_ms, [tuple(m) for m in e.window])
            for pid, e in self.real.producers
        ]
        assert real == self.model.table()


TestProducerTable = ProducerTableMachine.TestCase
