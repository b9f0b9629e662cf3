"""The chaos workload's Kafka side without a cluster: how librdkafka's delivery errors become
outcomes, and how its callbacks, called on its polling thread, reach the history on the loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from confluent_kafka import KafkaError

from cluster.chaos.clients import Sent
from cluster.chaos.history import parse_event
from cluster.chaos.kafka_clients import Callbacks, outcome_kind
from statemachine.errors import ErrorCode


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (KafkaError(KafkaError._MSG_TIMED_OUT), "info"),  # may have been written
        (KafkaError(KafkaError._PURGE_INFLIGHT), "info"),
        (KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION), "info"),
        (KafkaError(KafkaError._TRANSPORT), "info"),
        (KafkaError(int(ErrorCode.INVALID_PRODUCER_EPOCH)), "fail"),  # the broker said no
        (KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER), "fail"),
        (KafkaError(KafkaError._PURGE_QUEUE), "fail"),  # never sent
        (KafkaError(KafkaError._FATAL), "fail"),
        (KafkaError(KafkaError._TRANSPORT, fatal=True), "fail"),  # fatal: as the brief says
        (KafkaError(-1_000), "info"),  # a code nobody knows
    ],
)
def test_a_delivery_error_is_fail_only_when_definite_or_fatal(error: KafkaError, kind: str) -> None:
    assert outcome_kind(error) == kind


class Message:
    """What a delivery report carries, as far as the callback reads it."""

    def __init__(self, offset: int | None = 41) -> None:
        self._offset = offset

    def offset(self) -> int | None:
        return self._offset

    def value(self) -> bytes:
        return b"p0-7"

    def partition(self) -> int:
        return 2


@pytest.mark.asyncio(loop_scope="function")
async def test_callbacks_from_librdkafkas_thread_reach_the_loop() -> None:
    recorded: list[dict[str, object]] = []

    def record(event: dict[str, object]) -> None:
        assert threading.current_thread() is threading.main_thread()
        recorded.append({"time_ms": 0, **event})

    callbacks = Callbacks("p0", record)
    loop = asyncio.get_running_loop()
    acked: asyncio.Future[Sent] = loop.create_future()
    refused: asyncio.Future[Sent] = loop.create_future()

    def librdkafka() -> None:  # as its poll() calls them, on the polling thread
        callbacks.log(40, "%s [%s] %s", "FAIL", "rdkafka#producer-1", "Connection refused")
        callbacks.error(KafkaError(KafkaError._FATAL, "fenced", fatal=True))
        callbacks.delivered(acked, None, Message())  # type: ignore[arg-type]
        callbacks.delivered(refused, KafkaError(KafkaError._MSG_TIMED_OUT), Message())  # type: ignore[arg-type]

    await asyncio.to_thread(librdkafka)
    assert await acked == Sent("ok", {"offset": 41, "pid": -1, "epoch": -1, "sequence": -1})
    assert await refused == Sent("info", {"error": "_MSG_TIMED_OUT"})
    assert callbacks.fatal == "_FATAL: fenced"
    events: list[Any] = [parse_event(e) for e in recorded]  # what the history accepts
    assert [(e.f, e.get("facility") or e.get("error")) for e in events] == [
        ("client_log", "FAIL"),
        ("client_error", "_FATAL"),
    ]
    callbacks.closed = True
    await asyncio.to_thread(callbacks.log, 40, "%s [%s] %s", "FAIL", "x", "after the end")
    await asyncio.sleep(0)
    assert len(recorded) == 2


@pytest.mark.asyncio(loop_scope="function")
async def test_a_delivery_without_an_offset_is_an_implicit_acknowledgement() -> None:
    """librdkafka acknowledges without an offset what a later success of the same session
    proves persisted (rd_kafka_dr_implicit_ack): an ok send, counted, never an anomaly."""
    recorded: list[dict[str, object]] = []
    callbacks = Callbacks("p0", lambda e: recorded.append({"time_ms": 0, **e}))
    delivered: asyncio.Future[Sent] = asyncio.get_running_loop().create_future()
    await asyncio.to_thread(callbacks.delivered, delivered, None, Message(None))  # type: ignore[arg-type]
    assert await delivered == Sent("ok", {"offset": -1, "pid": -1, "epoch": -1, "sequence": -1})
    await asyncio.sleep(0)
    assert recorded == []
    assert callbacks.stats["implicit_acks"] == 1
