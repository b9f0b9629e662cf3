"""A small synchronous wrapper around the async client, for scripts and the CLI.

`SyncClient` runs one event loop on a background thread and forwards calls to the async
`Client`, `Admin`, `Producer` and `Consumer`; every call takes a timeout. `SyncProducer.send`
returns a `concurrent.futures.Future` with the record's offset, so a script can pipeline sends
and still wait for each acknowledgement.

Rules: a call rides out dead nodes and leader changes for `call_timeout_s` (the cluster's
retry policy) and then fails with the client's one-line CallTimeoutError; the thread's own
wait (`call`'s timeout) is longer, so that error, not a bare TimeoutError, is what a caller
sees. A call whose wait runs out anyway is cancelled on the loop, not left running.

    with SyncClient(["127.0.0.2:9092"]) as client:
        client.create_topic("orders", partitions=3, replication_factor=3)
        with client.producer() as producer:
            futures = [producer.send("orders", b"hello", key=b"k") for _ in range(100)]
            offsets = [f.result().offset for f in futures]
        records = client.consume("orders", max_records=100)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Iterable, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

from cluster import native as p
from cluster.client.admin import Admin
from cluster.client.consumer import ConsumedRecord, Consumer
from cluster.client.metadata import Client
from cluster.client.producer import Producer, ProducerConfig, RecordMetadata
from cluster.client.retry import RetryPolicy
from cluster.client.transactions import TransactionalProducer

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 60.0
WAIT_MARGIN_S = 5.0  # a thread waits this much past the call's own timeouts


class SyncClient:
    def __init__(
        self,
        bootstrap: Sequence[str],
        *,
        request_timeout_s: float = 10.0,
        call_timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.cluster = Client(
            bootstrap, request_timeout_s=request_timeout_s, retry=RetryPolicy(call_timeout_s)
        )
        self.admin = Admin(self.cluster)
        self.call_timeout_s = call_timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="raftbroker-client", daemon=True
        )
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run a coroutine on the client's loop and wait for its result (by default, a little
        longer than the call may take: its retries, then one more request)."""
        if timeout_s is None:
            timeout_s = self.call_timeout_s + self.cluster.request_timeout_s + WAIT_MARGIN_S
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    def create_topic(
        self, name: str, partitions: int, replication_factor: int, **options: int
    ) -> int:
        return self.call(self.admin.create_topic(name, partitions, replication_factor, **options))

    def delete_topic(self, name: str) -> None:
        self.call(self.admin.delete_topic(name))

    def describe_topics(self, names: Iterable[str] = ()) -> p.MetadataResponse:
        return self.call(self.admin.describe_topics(list(names)))

    def describe_producers(
        self, topic: str, partitions: Iterable[int] | None = None
    ) -> list[p.PartitionProducers]:
        return self.call(self.admin.describe_producers(topic, partitions))

    def cluster_status(self, address: str | None = None) -> p.ClusterStatusResponse:
        return self.call(self.admin.cluster_status(address))

    def producer(self, config: ProducerConfig | None = None) -> SyncProducer:
        return SyncProducer(self, Producer(self.cluster, config))

    def consume(
        self,
        topic: str,
        *,
        partitions: Iterable[int] | None = None,
        start: int = Consumer.EARLIEST,
        max_records: int | None = None,
        idle_timeout_s: float = 1.0,
    ) -> list[ConsumedRecord]:
        """Read from `start` until `max_records`, or until the partitions' leaders have had
        nothing more for idle_timeout_s. A partition whose leader does not answer is waited
        for up to call_timeout_s (then CallTimeoutError), not taken for one with nothing."""
        return self.call(self._consume(topic, partitions, start, max_records, idle_timeout_s))

    async def _consume(
        self,
        topic: str,
        partitions: Iterable[int] | None,
        start: int,
        max_records: int | None,
        idle_timeout_s: float,
    ) -> list[ConsumedRecord]:
        consumer = Consumer(self.cluster)
        await consumer.assign(topic, partitions, start)
        records: list[ConsumedRecord] = []
        wait_ms = int(idle_timeout_s * 1000)
        while max_records is None or len(records) < max_records:
            batch = await consumer.poll(wait_ms)
            records.extend(batch)
            if batch:
                continue
            if not consumer.stalled:
                break
            stalled_too_long = consumer.stall_error(self.call_timeout_s)
            if stalled_too_long is not None:
                raise stalled_too_long
        return records if max_records is None else records[:max_records]

    def close(self) -> None:
        if self._loop.is_running():
            self.call(self.cluster.close(), 10.0)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10.0)
        self._loop.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncProducer:
    """An idempotent (or transactional) producer driven from a synchronous thread."""

    def __init__(self, client: SyncClient, producer: Producer | TransactionalProducer) -> None:
        self._client = client
        self._producer = producer
        # A flush may take as long as a delivery may: wait that, and a little more.
        delivery_s = producer.config.delivery_timeout_ms / 1000
        self._flush_timeout_s = delivery_s + client.cluster.request_timeout_s + WAIT_MARGIN_S

    def __enter__(self) -> Self:
        self._client.call(self._producer.__aenter__(), self._flush_timeout_s)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._client.call(self._producer.__aexit__(exc_type, exc, tb), self._flush_timeout_s)

    def send(
        self, topic: str, value: bytes | None, key: bytes | None = None, **options: Any
    ) -> concurrent.futures.Future[RecordMetadata]:
        """Queue a record (in call order); the future resolves when it is acknowledged."""
        queued = self._client.call(self._producer.send(topic, value, key, **options))
        acknowledged: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()

        def copy(done: asyncio.Future[RecordMetadata]) -> None:  # on the client's loop
            if done.cancelled():
                acknowledged.cancel()
            elif (error := done.exception()) is not None:
                acknowledged.set_exception(error)
            else:
                acknowledged.set_result(done.result())

        self._client._loop.call_soon_threadsafe(queued.add_done_callback, copy)
        return acknowledged

    def flush(self, timeout_s: float | None = None) -> None:
        self._client.call(self._producer.flush(), timeout_s or self._flush_timeout_s)
