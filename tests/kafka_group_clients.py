"""Kafka's three Python consumers behind one small interface, for the consumer-group tests: a
group member that subscribes, polls, commits and reads its group's commits, whichever client
it is (confluent-kafka, kafka-python, aiokafka: each speaks the group protocol itself; and
`native`, raftbroker's own `GroupConsumer` over the native protocol, whose bootstrap is the
nodes' native addresses).

Run as a module, a member that subscribes and writes its assignment to a file whenever it has
one, for ever: the process a test SIGKILLs (`python -m tests.kafka_group_clients KIND
BOOTSTRAP GROUP TOPIC FILE`).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol

SESSION_TIMEOUT_MS = 3_000  # the test cluster allows it (group_session_timeout_ms_min)
HEARTBEAT_INTERVAL_MS = 500
POLL_MS = 100
KINDS = ("confluent-kafka", "kafka-python", "aiokafka")
CALL_TIMEOUT_S = 60.0
KAFKA_PYTHON_METADATA_MAX_AGE_MS = 5_000


class Member(Protocol):
    def subscribe(self, topic: str) -> None: ...

    def poll(self) -> list[tuple[int, int]]:
        """The (partition, offset) of the records this poll returned."""
        ...

    def assignment(self) -> set[int]: ...

    def commit(self, topic: str, partition: int, offset: int) -> None: ...

    def committed(self, topic: str, partition: int) -> int | None: ...

    def close(self) -> None: ...


class ConfluentMember:
    def __init__(self, bootstrap: str, group: str, instance: str | None, session_ms: int) -> None:
        from confluent_kafka import Consumer  # noqa: PLC0415 - only where used

        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": session_ms,
            "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
        }
        if instance is not None:
            config["group.instance.id"] = instance
        if logging.getLogger("librdkafka").isEnabledFor(logging.DEBUG):
            # Its requests and their versions, to the logger a test captures (`captured`).
            config |= {"debug": "protocol,cgrp", "logger": logging.getLogger("librdkafka")}
        self._c = Consumer(config)

    def subscribe(self, topic: str) -> None:
        self._c.subscribe([topic])

    def poll(self) -> list[tuple[int, int]]:
        message = self._c.poll(POLL_MS / 1000)
        if message is None:
            return []
        assert message.error() is None, message.error()
        return [(message.partition() or 0, message.offset() or 0)]

    def assignment(self) -> set[int]:
        return {tp.partition for tp in self._c.assignment()}

    def commit(self, topic: str, partition: int, offset: int) -> None:
        from confluent_kafka import TopicPartition  # noqa: PLC0415

        self._c.commit(offsets=[TopicPartition(topic, partition, offset)], asynchronous=False)

    def committed(self, topic: str, partition: int) -> int | None:
        from confluent_kafka import TopicPartition  # noqa: PLC0415

        (found,) = self._c.committed([TopicPartition(topic, partition)], timeout=30)
        return None if found.offset < 0 else int(found.offset)

    def close(self) -> None:
        self._c.close()


class KafkaPythonMember:
    def __init__(self, bootstrap: str, group: str, instance: str | None, session_ms: int) -> None:
        from kafka import KafkaConsumer  # noqa: PLC0415

        extra = {} if instance is None else {"group_instance_id": instance}
        self._c = KafkaConsumer(
            bootstrap_servers=bootstrap.split(","),
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=session_ms,
            heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
            # A backstop only (the default is 5 minutes): see subscribe.
            metadata_max_age_ms=KAFKA_PYTHON_METADATA_MAX_AGE_MS,
            **extra,
        )

    def subscribe(self, topic: str) -> None:
        # kafka-python joins without waiting for the metadata its subscription asked for; a
        # Metadata answer already under way (for the topics it had before) then clears that
        # request, and a leader assigns the topic from metadata without it: nothing, until
        # the next refresh. Its own metadata of the topic first, as an application that
        # looks the topic up before subscribing has, then the subscription.
        self._c.partitions_for_topic(topic)
        self._c.subscribe([topic])

    def poll(self) -> list[tuple[int, int]]:
        batches = self._c.poll(timeout_ms=POLL_MS)
        return [(tp.partition, r.offset) for tp, records in batches.items() for r in records]

    def assignment(self) -> set[int]:
        return {tp.partition for tp in self._c.assignment()}

    def commit(self, topic: str, partition: int, offset: int) -> None:
        from kafka import TopicPartition  # noqa: PLC0415
        from kafka.structs import OffsetAndMetadata  # noqa: PLC0415

        self._c.commit({TopicPartition(topic, partition): OffsetAndMetadata(offset, "", -1)})

    def committed(self, topic: str, partition: int) -> int | None:
        from kafka import TopicPartition  # noqa: PLC0415

        found = self._c.committed(TopicPartition(topic, partition))
        return None if found is None else int(found)

    def close(self) -> None:
        self._c.close()


class AioMember:
    """aiokafka's consumer on a loop of its own, which runs during each call (its heartbeats
    too: `Threaded` calls its poll without pause)."""

    def __init__(self, bootstrap: str, group: str, instance: str | None, session_ms: int) -> None:
        from aiokafka import AIOKafkaConsumer  # noqa: PLC0415

        self._loop = asyncio.new_event_loop()
        extra = {} if instance is None else {"group_instance_id": instance}

        async def make() -> Any:
            return AIOKafkaConsumer(
                bootstrap_servers=bootstrap,
                group_id=group,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                session_timeout_ms=session_ms,
                heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
                **extra,
            )

        self._c = self._loop.run_until_complete(make())
        self._loop.run_until_complete(self._c.start())

    def subscribe(self, topic: str) -> None:
        self._c.subscribe([topic])

    def poll(self) -> list[tuple[int, int]]:
        batches = self._loop.run_until_complete(self._c.getmany(timeout_ms=POLL_MS))
        return [(tp.partition, r.offset) for tp, records in batches.items() for r in records]

    def assignment(self) -> set[int]:
        return {tp.partition for tp in self._c.assignment()}

    def commit(self, topic: str, partition: int, offset: int) -> None:
        from aiokafka import TopicPartition  # noqa: PLC0415

        self._loop.run_until_complete(self._c.commit({TopicPartition(topic, partition): offset}))

    def committed(self, topic: str, partition: int) -> int | None:
        from aiokafka import TopicPartition  # noqa: PLC0415

        found = self._loop.run_until_complete(self._c.committed(TopicPartition(topic, partition)))
        return None if found is None else int(found)

    def close(self) -> None:
        try:
            self._loop.run_until_complete(self._c.stop())
        finally:
            self._loop.close()


class NativeMember:
    """raftbroker's `GroupConsumer` on a loop of its own, which runs during each call, as
    `AioMember`; `bootstrap` is the nodes' native addresses, comma-separated."""

    def __init__(self, bootstrap: str, group: str, instance: str | None, session_ms: int) -> None:
        from cluster.client import Client, Consumer, GroupConfig  # noqa: PLC0415

        self._loop = asyncio.new_event_loop()
        self._group = group
        self._config = GroupConfig(
            session_timeout_ms=session_ms,
            heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
            instance_id=instance or "",
            client_id="native-member",
            auto_offset_reset=Consumer.EARLIEST,
        )

        async def make() -> Client:
            return Client(bootstrap.split(","), request_timeout_s=5.0)

        self._cluster = self._loop.run_until_complete(make())
        self._c: Any = None

    def subscribe(self, topic: str) -> None:
        from cluster.client import GroupConsumer  # noqa: PLC0415

        self._c = GroupConsumer(self._cluster, self._group, [topic], self._config)

    def poll(self) -> list[tuple[int, int]]:
        records = self._loop.run_until_complete(self._c.poll(POLL_MS))
        return [(r.partition, r.offset) for r in records]

    def assignment(self) -> set[int]:
        return {partition for _, partition in self._c.assignment()}

    def commit(self, topic: str, partition: int, offset: int) -> None:
        self._loop.run_until_complete(self._c.commit({(topic, partition): offset}))

    def committed(self, topic: str, partition: int) -> int | None:
        raise NotImplementedError("not needed by the native tests")

    def close(self) -> None:
        try:
            if self._c is not None:
                self._loop.run_until_complete(self._c.close())
            self._loop.run_until_complete(self._cluster.close())
        finally:
            self._loop.close()


class Threaded:
    """A member whose client polls without pause in a thread of its own, as an application's
    consumer would: a member a test does not poll still heartbeats and rejoins (kafka-python
    rejoins, and aiokafka runs at all, only inside its poll; polled in turn from one thread,
    one member's rejoin would wait on another's poll). Every call runs in that thread."""

    def __init__(self, make: Callable[[], Member]) -> None:
        self._calls: queue.Queue[tuple[Callable[[Member], Any], Future[Any]]] = queue.Queue()
        self._lock = threading.Lock()
        self._read: list[tuple[int, int]] = []
        self._owned: set[int] = set()
        self.history: list[set[int]] = []  # each assignment it held, in turn
        self._stop = threading.Event()
        self._subscribed = threading.Event()
        started: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, args=(make, started), daemon=True)
        self._thread.start()
        started.result(CALL_TIMEOUT_S)

    def _run(self, make: Callable[[], Member], started: Future[None]) -> None:
        try:
            client = make()
        except Exception as exc:  # noqa: BLE001 - handed to the test's thread
            started.set_exception(exc)
            return
        started.set_result(None)
        try:
            while not self._stop.is_set():
                while not self._calls.empty():
                    fn, done = self._calls.get()
                    try:
                        done.set_result(fn(client))
                    except Exception as exc:  # noqa: BLE001 - handed to the caller
                        done.set_exception(exc)
                if not self._subscribed.is_set():  # aiokafka refuses a poll before it
                    time.sleep(POLL_MS / 1000)
                    continue
                read, owned = client.poll(), client.assignment()
                with self._lock:
                    self._read += read
                    self._owned = owned
                    if not self.history or self.history[-1] != owned:
                        self.history.append(owned)
        finally:
            client.close()

    def _call(self, fn: Callable[[Member], Any]) -> Any:
        done: Future[Any] = Future()
        self._calls.put((fn, done))
        return done.result(CALL_TIMEOUT_S)

    def subscribe(self, topic: str) -> None:
        self._call(lambda c: c.subscribe(topic))
        self._subscribed.set()

    def poll(self) -> list[tuple[int, int]]:
        time.sleep(POLL_MS / 1000 / 2)  # the client's thread polls meanwhile
        with self._lock:
            read, self._read = self._read, []
        return read

    def assignment(self) -> set[int]:
        with self._lock:
            return set(self._owned)

    def commit(self, topic: str, partition: int, offset: int) -> None:
        self._call(lambda c: c.commit(topic, partition, offset))

    def committed(self, topic: str, partition: int) -> int | None:
        found: int | None = self._call(lambda c: c.committed(topic, partition))
        return found

    def close(self) -> None:
        self._stop.set()
        self._thread.join(CALL_TIMEOUT_S)


def member(
    kind: str,
    bootstrap: str,
    group: str,
    instance: str | None = None,
    session_ms: int = SESSION_TIMEOUT_MS,
) -> Threaded:
    makers: dict[str, type[ConfluentMember | KafkaPythonMember | AioMember | NativeMember]] = {
        "confluent-kafka": ConfluentMember,
        "kafka-python": KafkaPythonMember,
        "aiokafka": AioMember,
        "native": NativeMember,
    }
    return Threaded(lambda: makers[kind](bootstrap, group, instance, session_ms))


def main(argv: list[str]) -> None:
    kind, bootstrap, group, topic, out = argv
    one = member(kind, bootstrap, group)
    one.subscribe(topic)
    while True:
        one.poll()
        owned = one.assignment()
        if owned:
            Path(out).write_text(",".join(map(str, sorted(owned))))


if __name__ == "__main__":
    main(sys.argv[1:])
