"""End-to-end latency through Kafka's protocol at a fixed rate: raftbroker's Kafka listener or
Apache Kafka, the same clients.

Role: `bench.kafka`'s e2e case (issue 36: "end-to-end latency p50/p99 at a fixed rate (produce
-> consumer receipt)", goal p99 <= 1.0x of Kafka's). One partition, replication 3, on a fresh
cluster of either broker. confluent-kafka's idempotent producer (`acks=all`, `linger.ms` 0)
sends `RATE_PER_S` records a second, each carrying the moment it was handed to the client
(`time.perf_counter_ns`, in its value: one machine, one clock); a confluent-kafka consumer
(assigned the partition, no group, `fetch.wait.max.ms` 100 and `fetch.min.bytes` 1, so a
fetch is answered as soon as a record is committed, on both brokers) takes each record and
notes its latency. A consumer reads only what is committed (Kafka's high watermark:
replicated to the in-sync replicas; raftbroker's: committed by a Raft majority), so the
latency counts the replication both brokers do before a reader may see a record. Records are
measured from the moment `WARM_S` have passed and the consumer holds every record sent
`CAUGHT_UP_S` before (connections, metadata, and on Kafka the group coordinator's topic that
librdkafka asks for: until then records queue, and counting them would measure the start,
not the broker).
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

TOPIC = "kafka-e2e"
RATE_PER_S = 1_000
WARM_S = 1.0
CAUGHT_UP_S = 0.5  # warm once the consumer holds every record sent this long ago
CONSUMER_READY_TIMEOUT_S = 30.0
DRAIN_TIMEOUT_S = 30.0
FLUSH_TIMEOUT_S = 60.0
STAMP_BYTES = 20  # the send time in ns, as decimal digits, padded
VALUE_BYTES = 100


def stamped(now_ns: int) -> bytes:
    return str(now_ns).rjust(STAMP_BYTES, "0").encode().ljust(VALUE_BYTES, b".")


class Reader(threading.Thread):
    """The consumer's thread: every record's latency, in ms, as it arrives."""

    def __init__(self, bootstrap: tuple[str, ...]) -> None:
        super().__init__(name="e2e-reader", daemon=True)
        self.expected: int | None = None  # how many to read: told once the sending ends
        self.latencies_ms: list[float] = []
        self.ready = threading.Event()
        self.failure: str | None = None
        self._consumer = Consumer(
            {
                "bootstrap.servers": ",".join(bootstrap),
                "group.id": "e2e-unused",  # librdkafka wants one; no group API is used
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 100,
                "fetch.min.bytes": 1,
            }
        )

    def run(self) -> None:
        consumer = self._consumer
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        self.ready.set()
        try:
            while self.expected is None or len(self.latencies_ms) < self.expected:
                if time.monotonic() > deadline:
                    self.failure = f"nothing read for {DRAIN_TIMEOUT_S} s"
                    return
                message = consumer.poll(0.05)
                if message is None:
                    continue
                if message.error() is not None:
                    self.failure = str(message.error())
                    return
                value = message.value()
                assert value is not None
                sent_ns = int(value[:STAMP_BYTES])
                self.latencies_ms.append((time.perf_counter_ns() - sent_ns) / 1e6)
                deadline = time.monotonic() + DRAIN_TIMEOUT_S
        finally:
            consumer.close()


def e2e_latencies(bootstrap: tuple[str, ...], seconds: float) -> dict[str, Any]:
    """Records at RATE_PER_S for `seconds` once the flow is warm, read as they come
    (blocking: runs in a thread of its own)."""
    reader = Reader(bootstrap)
    reader.start()
    if not reader.ready.wait(CONSUMER_READY_TIMEOUT_S):
        raise AssertionError("the consumer did not start")
    producer = Producer(
        {
            "bootstrap.servers": ",".join(bootstrap),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 0,
        }
    )
    started = time.monotonic()
    warm: int | None = None  # the first measured record's index
    index = 0
    while warm is None or index < warm + int(seconds * RATE_PER_S):
        time.sleep(max(0.0, started + index / RATE_PER_S - time.monotonic()))  # the rate
        producer.produce(TOPIC, stamped(time.perf_counter_ns()), partition=0)
        producer.poll(0)
        index += 1
        now = time.monotonic()
        caught_up = len(reader.latencies_ms) >= (now - started - CAUGHT_UP_S) * RATE_PER_S
        if warm is None and now - started >= WARM_S and caught_up:
            warm = index
        elif warm is None and now - started > CONSUMER_READY_TIMEOUT_S:
            raise AssertionError(f"nothing read in {CONSUMER_READY_TIMEOUT_S} s")
    count = index
    if producer.flush(FLUSH_TIMEOUT_S):
        raise AssertionError("records not acknowledged")
    reader.expected = count
    reader.join(DRAIN_TIMEOUT_S + 5)
    if reader.failure or len(reader.latencies_ms) != count:
        raise AssertionError(f"read {len(reader.latencies_ms)} of {count}: {reader.failure}")
    measured = sorted(reader.latencies_ms[warm:])
    return {
        "records": len(measured),
        "rate_per_s": RATE_PER_S,
        "p50_ms": statistics.median(measured),
        "p99_ms": measured[int(len(measured) * 0.99) - 1],
        "max_ms": measured[-1],
        "params": {
            "producer": "confluent-kafka, idempotent, acks=all, linger.ms 0",
            "consumer": "confluent-kafka, assigned, fetch.wait.max.ms 100, fetch.min.bytes 1",
            "measure": "consumer receipt - the moment the record was handed to the producer",
        },
    }
