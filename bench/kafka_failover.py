"""Failover through Kafka's protocol: raftbroker's Kafka listener or Apache Kafka, the same client.

Role: `bench.kafka`'s failover case (issue 36: "SIGKILL of a partition leader -> next
acknowledged write", goal <= 0.3x of Kafka's). One partition, replication 3, on a fresh cluster
of either broker; confluent-kafka's idempotent producer (`acks=all`, `linger.ms` 0, librdkafka's
default retries and timeouts) sends a record every 2 ms and polls its delivery reports; after
1 s of steady acknowledgements the partition's leader (as the producer's metadata names it) is
SIGKILLed. The measure is the time from the kill to the first acknowledgement of a record sent
after it, as a user's application sees its writes resume. The sending goes on for a moment after
that and every record must then be acknowledged (the producer's retries carry the ones in
flight across): a record lost or failed fails the case. One kill per cluster (a kill leaves two
of three replicas, which still take `acks=all` writes on both brokers: Kafka's
`min.insync.replicas` is 2, a Raft majority is 2), `kills` clusters per broker.

What each broker does meanwhile: raftbroker's partition is a Raft group whose followers elect a
new leader when the leader's heartbeats stop (`election_timeout_ms_min`..`max`); Apache Kafka's
controller fences the dead broker when its session expires (`broker.session.timeout.ms`, 9 s by
default, kept: these are the defaults its users run) and moves leadership to an in-sync replica,
after a new controller is elected first when the dead node was the active one (combined mode).
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from bench.harness import value_of

TOPIC = "kafka-failover"
PACE_S = 0.002
STEADY_S = 1.0
AFTER_RESUME_S = 0.5  # sending goes on this long after the first ack past the kill
RESUME_TIMEOUT_S = 60.0
FLUSH_TIMEOUT_S = 60.0
METADATA_TIMEOUT_S = 10.0


@dataclass(slots=True)
class Deliveries:
    """How many records were acknowledged, the errors reported, and when the first record
    sent after the kill (index `first_after_kill` on) was acknowledged."""

    acked: int = 0
    errors: list[str] = field(default_factory=list)
    first_after_kill: int | None = None
    resumed_at: float | None = None

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.errors.append(str(error))
            return
        self.acked += 1
        key = message.key()
        assert key is not None
        after = self.first_after_kill
        if self.resumed_at is None and after is not None and int(key) >= after:
            self.resumed_at = time.monotonic()


def leader_pid(producer: Producer, pids: dict[str, int]) -> int:
    """The process of the partition's leader: `pids` names each node `<word><node id>`."""
    metadata = producer.list_topics(TOPIC, timeout=METADATA_TIMEOUT_S)
    leader = metadata.topics[TOPIC].partitions[0].leader
    by_id = {int(re.sub(r"\D", "", name)): pid for name, pid in pids.items()}
    return by_id[leader]


def one_failover(bootstrap: tuple[str, ...], pids: Callable[[], dict[str, int]]) -> dict[str, Any]:
    """Steady sends, the leader's SIGKILL, the sends' resumption (runs in a thread: blocking)."""
    deliveries = Deliveries()
    producer = Producer(
        {
            "bootstrap.servers": ",".join(bootstrap),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 0,
            "message.timeout.ms": int(RESUME_TIMEOUT_S * 2 * 1000),
            "on_delivery": deliveries,
        }
    )
    started = time.monotonic()
    killed_at: float | None = None
    index = 0
    while (resumed := deliveries.resumed_at) is None or time.monotonic() - resumed < AFTER_RESUME_S:
        now = time.monotonic()
        if killed_at is None and now - started >= STEADY_S:
            os.kill(leader_pid(producer, pids()), signal.SIGKILL)
            killed_at = time.monotonic()
            deliveries.first_after_kill = index
        elif killed_at is not None and now - killed_at > RESUME_TIMEOUT_S:
            raise AssertionError(f"no acknowledgement within {RESUME_TIMEOUT_S} s of the kill")
        producer.produce(TOPIC, value_of(index), key=str(index).encode(), partition=0)
        index += 1
        producer.poll(0)
        time.sleep(max(0.0, started + index * PACE_S - time.monotonic()))  # the pace, not a sync
    left = producer.flush(FLUSH_TIMEOUT_S)
    assert killed_at is not None
    assert deliveries.resumed_at is not None
    lost = index - deliveries.acked
    if left or lost or deliveries.errors:
        raise AssertionError(f"{lost} records not acknowledged, errors {deliveries.errors[:5]}")
    return {"failover_ms": (deliveries.resumed_at - killed_at) * 1000, "records": index}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    times = [r["failover_ms"] for r in runs]
    return {
        "kills": len(runs),
        "failover_ms": times,
        "p50_ms": statistics.median(times),
        "max_ms": max(times),
        "records": sum(r["records"] for r in runs),
        "params": {
            "client": "confluent-kafka (librdkafka), idempotent, acks=all, linger.ms 0",
            "pace_ms": PACE_S * 1000,
            "measure": "SIGKILL of the partition leader -> first ack of a record sent after it",
        },
    }
