"""The generated logs of tests/property/test_replicas_converge.py (its docstring says what they
hold and what the tests prove with them): the operations a partition's and the metadata group's
log are drawn from, the strategies that draw them, the builders that turn them into entries as
leaders would have stamped them, and the checks two replicas are held to."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from hypothesis import strategies as st

from statemachine.commands import (
    AdvanceLogStart,
    AllocatePidBlock,
    AppendBatch,
    AppendFencedBatch,
    Command,
    CreateTopic,
    DeleteTopic,
    ExpireProducers,
    ExpireTransactionalIds,
    InitTransactionalProducer,
    Noop,
    RegisterBroker,
    RegisterTxnPartition,
    WriteTxnMarker,
)
from statemachine.metadata import MetadataStateMachine
from statemachine.records import Record, RecordBatch, encode_batch
from statemachine.txn_registry import TxnEntry

SEQ_MAX = 2**31 - 1
PIDS = 2
GARBAGE = st.binary(max_size=40)
PLAIN_BATCH = RecordBatch(-1, -1, -1, (Record(None, b"v", 1),)).encode()


class Replica(Protocol):
    def apply(self, entry: bytes, /) -> object: ...

    def snapshot(self) -> bytes: ...


R = TypeVar("R", bound=Replica)


def assert_same_results(actual: Sequence[object], expected: Sequence[object]) -> None:
    """Equal values of the same classes (equal NamedTuples of different classes compare equal)."""
    assert [type(r) for r in actual] == [type(r) for r in expected]
    assert list(actual) == list(expected)


def check_two_replicas(entries: list[bytes], fresh: Callable[[], Replica]) -> None:
    one, two = fresh(), fresh()
    for entry in entries:
        assert_same_results([two.apply(bytes(bytearray(entry)))], [one.apply(entry)])
        assert one.snapshot() == two.snapshot()


def check_restore_at(
    entries: list[bytes], split: int, fresh: Callable[[], R], restore: Callable[[bytes], R]
) -> None:
    replayed = fresh()
    results = [replayed.apply(e) for e in entries]
    head = fresh()
    for entry in entries[:split]:
        head.apply(entry)
    snapshot = head.snapshot()
    restored = restore(snapshot)
    assert restored.snapshot() == snapshot
    assert_same_results([restored.apply(e) for e in entries[split:]], results[split:])
    assert restored.snapshot() == replayed.snapshot()


def check_restore_everywhere(
    entries: list[bytes], fresh: Callable[[], R], restore: Callable[[bytes], R]
) -> None:
    replayed, hopping = fresh(), fresh()
    for entry in entries:
        assert_same_results([hopping.apply(entry)], [replayed.apply(entry)])
        hopping = restore(hopping.snapshot())
        assert hopping.snapshot() == replayed.snapshot()


# -- partition logs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Produce:
    """A burst of consecutive batches from one producer."""

    who: int
    counts: tuple[int, ...]


@dataclass(frozen=True)
class Retry:
    who: int
    back: int


@dataclass(frozen=True)
class Gap:
    who: int
    gap: int
    count: int


@dataclass(frozen=True)
class Bump:
    who: int
    base_seq: int


@dataclass(frozen=True)
class Fenced:
    who: int


@dataclass(frozen=True)
class NearWrap:
    below_wrap: int
    count: int


@dataclass(frozen=True)
class Plain:
    count: int


@dataclass(frozen=True)
class Corrupt:
    who: int
    position: int
    mask: int


@dataclass(frozen=True)
class Tick:
    delta_ms: int


@dataclass(frozen=True)
class Expire:
    expiration_ms: int
    lag_ms: int  # a leader whose clock is behind stamps an earlier time


@dataclass(frozen=True)
class Raw:
    """An entry given as is: AdvanceLogStart, Noop, a foreign command, or garbage bytes."""

    entry: bytes


@dataclass(frozen=True)
class SinkPart:
    """A streaming sink's fenced part of plain records, stamped with the log's time."""

    sink: str
    writer: int
    batch_id: int
    part: int


@dataclass(frozen=True)
class TxnBegin:
    """The coordinator registers the partition in the producer's next transaction (or, with
    `back`, in an earlier one again: a replay of the open one, or a stale registration)."""

    who: int
    back: int


@dataclass(frozen=True)
class TxnSend:
    """Transactional batches of the producer (inside a registered transaction or not)."""

    who: int
    counts: tuple[int, ...]


@dataclass(frozen=True)
class TxnEnd:
    """A marker for the producer's transaction `back` transactions ago (0: the current)."""

    who: int
    commit: bool
    back: int
    coordinator_epoch: int


PartitionOp = (
    TxnBegin
    | TxnSend
    | TxnEnd
    | Produce
    | Retry
    | Gap
    | Bump
    | Fenced
    | NearWrap
    | Plain
    | Corrupt
    | Tick
    | Expire
    | Raw
    | SinkPart
)

WHO = st.integers(0, PIDS - 1)
COUNT = st.integers(1, 4)
PARTITION_OPS: st.SearchStrategy[PartitionOp] = st.one_of(
    st.builds(Produce, WHO, st.lists(COUNT, min_size=1, max_size=7).map(tuple)),
    st.builds(Produce, WHO, st.lists(COUNT, min_size=1, max_size=7).map(tuple)),
    st.builds(Retry, WHO, st.integers(0, 7)),
    st.builds(Gap, WHO, st.integers(1, 20), COUNT),
    st.builds(Bump, WHO, st.sampled_from([0, 0, 1, 7])),
    st.builds(Fenced, WHO),
    st.builds(NearWrap, st.integers(0, 4), COUNT),
    st.builds(Plain, COUNT),
    st.builds(Corrupt, WHO, st.integers(0, 200), st.integers(1, 255)),
    st.builds(Tick, st.integers(0, 4_000)),
    st.builds(Expire, st.integers(1, 6_000), st.sampled_from([0, 0, 500, 10_000])),
    st.builds(Raw, st.builds(lambda o: AdvanceLogStart(o).encode(), st.integers(0, 60))),
    st.builds(Raw, st.builds(lambda m: Noop(m).encode(), st.integers(0, 9))),
    st.builds(Raw, st.just(DeleteTopic("orders").encode())),
    st.builds(Raw, GARBAGE),
    # Transactions: registrations, transactional data and markers, some stale or replayed.
    st.builds(TxnBegin, WHO, st.sampled_from([0, 0, 0, 1])),
    st.builds(TxnSend, WHO, st.lists(COUNT, min_size=1, max_size=3).map(tuple)),
    st.builds(TxnSend, WHO, st.lists(COUNT, min_size=1, max_size=3).map(tuple)),
    st.builds(TxnEnd, WHO, st.booleans(), st.sampled_from([0, 0, 0, 1]), st.integers(0, 2)),
    # A streaming sink's fenced parts: new, replayed and out of order, from two sinks.
    st.builds(
        Raw,
        st.builds(
            lambda sink, writer, batch_id, part, now_ms: AppendFencedBatch(
                now_ms, PLAIN_BATCH, sink, writer, batch_id, part
            ).encode(),
            st.sampled_from(["orders-sink", "audit", ""]),
            st.integers(0, 1),
            st.integers(0, 3),
            st.integers(0, 2),
            st.integers(0, 9_000),
        ),
    ),
)


@dataclass
class ClientSession:
    """What the log generator believes about one producer: it may well be wrong."""

    producer_id: int
    epoch: int = 0
    next_seq: int = 0
    sent: list[bytes] = field(default_factory=list)
    txn_sequence: int = 0  # the coordinator's number of this producer's next transaction


def batch_of(
    producer_id: int, epoch: int, base_seq: int, count: int, stamp: int, *, txn: bool = False
) -> bytes:
    records = tuple(Record(b"k", b"v%d" % i, stamp) for i in range(count))
    return encode_batch(producer_id, epoch, base_seq, records, transactional=txn)


class PartitionLog:
    """Turns ops into entries, keeping each producer's (believed) session and the time."""

    def __init__(self) -> None:
        self.now_ms = 1_000
        self.clients = [ClientSession(100 + i) for i in range(PIDS)]
        self.entries: list[bytes] = []

    def append(self, batch: bytes) -> None:
        self.entries.append(AppendBatch(self.now_ms, batch).encode())

    def send(
        self, client: ClientSession, epoch: int, base_seq: int, count: int, *, txn: bool = False
    ) -> None:
        batch = batch_of(client.producer_id, epoch, base_seq, count, self.now_ms, txn=txn)
        client.sent.append(batch)
        self.append(batch)

    def produce(self, client: ClientSession, count: int, *, txn: bool = False) -> None:
        self.send(client, client.epoch, client.next_seq, count, txn=txn)
        client.next_seq = (client.next_seq + count) % (SEQ_MAX + 1)

    def add_txn(self, op: TxnBegin | TxnSend | TxnEnd) -> None:
        match op:
            case TxnBegin(who, back):
                client = self.clients[who]
                sequence = max(0, client.txn_sequence - back)
                entry = RegisterTxnPartition(
                    self.now_ms, client.producer_id, client.epoch, sequence
                )
                self.entries.append(entry.encode())
            case TxnSend(who, counts):
                for count in counts:
                    self.produce(self.clients[who], count, txn=True)
            case TxnEnd(who, commit, back, coordinator_epoch):
                client = self.clients[who]
                sequence = max(0, client.txn_sequence - back)
                marker = WriteTxnMarker(
                    self.now_ms, client.producer_id, client.epoch, sequence, int(commit),
                    coordinator_epoch,
                )  # fmt: skip
                self.entries.append(marker.encode())
                if back == 0:
                    client.txn_sequence += 1

    def add(self, op: PartitionOp) -> None:
        match op:
            case Produce(who, counts):
                for count in counts:
                    self.produce(self.clients[who], count)
            case Retry(who, back):
                sent = self.clients[who].sent
                if sent:
                    self.append(sent[-1 - back % len(sent)])
            case Gap(who, gap, count):
                client = self.clients[who]
                self.send(client, client.epoch, (client.next_seq + gap) % (SEQ_MAX + 1), count)
            case Bump(who, base_seq):
                client = self.clients[who]
                client.epoch, client.next_seq = client.epoch + 1, base_seq
                self.produce(client, 1)
            case Fenced(who):
                client = self.clients[who]
                self.send(client, max(0, client.epoch - 1), client.next_seq, 1)
            case NearWrap(below_wrap, count):
                client = ClientSession(100 + len(self.clients), 0, SEQ_MAX - below_wrap)
                self.clients.append(client)
                self.produce(client, count)
            case TxnBegin() | TxnSend() | TxnEnd():
                self.add_txn(op)
            case Corrupt(who, position, mask):
                client = self.clients[who]
                batch = bytearray(batch_of(client.producer_id, client.epoch, 0, 2, self.now_ms))
                batch[position % len(batch)] ^= mask
                self.append(bytes(batch))
            case _:
                self.add_other(op)

    def add_other(self, op: PartitionOp) -> None:
        match op:
            case Plain(count):
                self.append(batch_of(-1, -1, -1, count, 1))
            case Tick(delta_ms):
                self.now_ms += delta_ms
            case Expire(expiration_ms, lag_ms):
                stamp = max(0, self.now_ms - lag_ms)
                self.entries.append(ExpireProducers(stamp, expiration_ms).encode())
            case Raw(entry):
                self.entries.append(entry)
            case SinkPart(sink, writer, batch_id, part):
                fenced = AppendFencedBatch(self.now_ms, PLAIN_BATCH, sink, writer, batch_id, part)
                self.entries.append(fenced.encode())


def partition_log(ops: list[PartitionOp]) -> list[bytes]:
    log = PartitionLog()
    for op in ops:
        log.add(op)
    return log.entries


PARTITION_LOGS = st.lists(PARTITION_OPS, min_size=15, max_size=80).map(partition_log)

# -- metadata logs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class InitTxn:
    txn_id: str
    timeout_ms: int
    expect: str  # none | current | previous | stale_epoch | other_pid | half


@dataclass(frozen=True)
class ExpireTxns:
    expiration_ms: int
    lag_ms: int


@dataclass(frozen=True)
class MetaTick:
    delta_ms: int


@dataclass(frozen=True)
class MetaRaw:
    entry: bytes


MetadataOp = InitTxn | ExpireTxns | MetaTick | MetaRaw

TOPICS = st.sampled_from(["orders", "orders", "payments", "a.b-c_1", "bad name", "", ".."])
ADDRESSES = st.sampled_from(["10.0.0.1:9092", "broker-2:19092", "[::1]:9093", "nohost", "h:0"])
BROKER_IDS = st.integers(0, 4)


def _raw(command: st.SearchStrategy[Command]) -> st.SearchStrategy[MetadataOp]:
    return command.map(lambda c: MetaRaw(c.encode()))


METADATA_OPS: st.SearchStrategy[MetadataOp] = st.one_of(
    _raw(st.builds(RegisterBroker, BROKER_IDS, ADDRESSES, ADDRESSES)),
    _raw(st.builds(RegisterBroker, BROKER_IDS, ADDRESSES, ADDRESSES)),
    _raw(
        st.builds(
            CreateTopic,
            TOPICS,
            st.sampled_from([1, 2, 3, 5, 2_000]),
            st.sampled_from([1, 1, 2, 3, 5]),
            st.sampled_from([-1, 60_000]),
            st.sampled_from([-1, 1 << 30]),
        )
    ),
    _raw(st.builds(DeleteTopic, TOPICS)),
    _raw(st.builds(AllocatePidBlock, BROKER_IDS, st.sampled_from([1, 10, 1_000, 2_000_000]))),
    st.builds(
        InitTxn,
        st.sampled_from(["tx-1", "tx-2", "tx-3", "", "tab\t"]),
        st.sampled_from([60_000, 60_000, 1, 0, 900_001]),
        st.sampled_from(["none", "current", "current", "previous", "stale_epoch", "other_pid"])
        | st.just("half"),
    ),
    st.builds(InitTxn, st.sampled_from(["tx-1", "tx-2"]), st.just(60_000), st.just("current")),
    st.builds(ExpireTxns, st.integers(1, 20_000), st.sampled_from([0, 0, 5_000])),
    st.builds(MetaTick, st.integers(0, 8_000)),
    st.builds(MetaRaw, st.builds(lambda m: Noop(m).encode(), st.integers(0, 9))),
    st.builds(MetaRaw, st.just(AdvanceLogStart(3).encode())),
    st.builds(MetaRaw, GARBAGE),
)


def expected_pair(entry: TxnEntry | None, expect: str) -> tuple[int, int]:
    """The (producer id, epoch) a caller passes, chosen from the registry's current entry."""
    if expect == "none" or entry is None:
        return (-1, -1)
    pairs = {
        "current": (entry.producer_id, entry.epoch),
        "previous": (entry.producer_id, entry.last_epoch),
        "stale_epoch": (entry.producer_id, entry.epoch + 1),
        "other_pid": (entry.producer_id + 1, entry.epoch),
        "half": (entry.producer_id, -1),  # only one of the two given: INVALID_REQUEST
    }
    return pairs[expect]


def metadata_log(ops: list[MetadataOp]) -> list[bytes]:
    scratch = MetadataStateMachine()
    now_ms = 1_000
    entries: list[bytes] = []
    for op in ops:
        match op:
            case InitTxn(txn_id, timeout_ms, expect):
                pid, epoch = expected_pair(scratch.txns.get(txn_id), expect)
                entry = InitTransactionalProducer(txn_id, timeout_ms, pid, epoch, now_ms).encode()
            case ExpireTxns(expiration_ms, lag_ms):
                entry = ExpireTransactionalIds(max(0, now_ms - lag_ms), expiration_ms).encode()
            case MetaTick(delta_ms):
                now_ms += delta_ms
                continue
            case MetaRaw(raw):
                entry = raw
        scratch.apply(entry)
        entries.append(entry)
    return entries


METADATA_LOGS = st.lists(METADATA_OPS, min_size=15, max_size=80).map(metadata_log)
