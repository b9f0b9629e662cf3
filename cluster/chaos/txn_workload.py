"""What the chaos workload's transactions are, whichever client runs them: the topics, the
cadence, the events, the watcher of every partition's last stable offset and high watermark,
and the end of the run (every transaction ended, then the final reads).

Role: the base of kafka_txns.py (Kafka's clients, `--client kafka`) and native_txns.py (the
client library, `--client native`), which run the same three processes (the writer `x0`, the
processor `y0`, the watcher `l0`) with their own client and record the same events, so one
checker (txn_checker.py) judges both. Each implements how it reads an offset, the final reads
and the processor's committed offsets; the writer, the processor and the coordinator's lookup
are theirs alone.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Mapping
from typing import Literal

from cluster.chaos.clients import Record
from cluster.client import Admin

TXN_TOPIC = "chaos-txn"
OUT_TOPIC = "chaos-txn-out"
CTP_GROUP = "chaos-ctp"
WRITER_ID = "chaos-txn-writer"  # the writer's transactional id (kill-txn-coordinator's aim)
CTP_ID = "chaos-ctp"
REPLICATION = 3
VALUES_PER_TXN = 3
ABORT_EVERY = 4
CTP_ABORT_EVERY = 5
CTP_BATCH_MAX = 50
TXN_TIMEOUT_MS = 10_000  # an abandoned transaction is aborted by then (the hanging check)
CALL_TIMEOUT_S = 15.0  # a transactional call (init, commit, abort, send offsets) gives up
HUNG = "client hung"  # the error of a transaction whose client call never returned
WRITER_INTERVAL_S = 0.05
WATCH_INTERVAL_S = 0.25
POLL_S = 0.1
DRAIN_TIMEOUT_S = 60.0
READ_TIMEOUT_S = 30.0

Rows = list[list[list[object]]]  # per partition, [offset, value, pid, epoch, seq] rows


class TxnWorkloadBase:
    """The watcher and the end of the run; the client-specific parts are the subclass's."""

    def __init__(self, partitions: int, record: Record, clock_ms: Callable[[], float]) -> None:
        self.partitions = partitions
        self._record = record
        self._clock_ms = clock_ms
        self.stopping = asyncio.Event()  # the writer stops; the processor drains
        self.drained = asyncio.Event()  # the processor read and committed every input

    def event(self, kind: str, process: str, f: str, **fields: object) -> None:
        self._record({"type": kind, "process": process, "f": f, **fields})

    async def create_topics(self, admin: Admin) -> None:
        for topic in (TXN_TOPIC, OUT_TOPIC):
            await admin.create_topic(topic, self.partitions, REPLICATION)
            await admin.wait_for_leaders(topic, READ_TIMEOUT_S)

    def values_of(self, process: str, n: int) -> list[tuple[int, str]]:
        """The writer's transaction `n`: a value on each of VALUES_PER_TXN partitions."""
        return [((n + k) % self.partitions, f"{process}-{n}-{k}") for k in range(VALUES_PER_TXN)]

    # -- what each client does -------------------------------------------------------------------

    async def run_writer(self, process: str) -> None:
        raise NotImplementedError

    async def run_processor(self, process: str) -> None:
        raise NotImplementedError

    async def coordinator_node(self) -> int | None:
        """The node coordinating the writer's transactional id (kill-txn-coordinator)."""
        raise NotImplementedError

    async def offset(self, topic: str, partition: int, *, read_committed: bool) -> tuple[int, int]:
        """(error code, offset) of a partition's LATEST, from its leader."""
        raise NotImplementedError

    async def read_final(self, topic: str, isolation: str) -> tuple[Rows, set[int]]:
        """Every partition of `topic` from its start to its end at this isolation level, and
        the partitions whose end the read reached."""
        raise NotImplementedError

    async def committed(self) -> list[list[int]]:
        """[partition, committed offset] of the processor's group, where it could be read."""
        raise NotImplementedError

    # -- the processor's loop, whatever its client -----------------------------------------------

    async def drive(
        self,
        numbers: itertools.count[int],
        poll: Callable[[], Awaitable[list[list[object]] | None]],
        transform: Callable[[list[list[object]], float, int], Awaitable[str]],
        rewind: Callable[[], Awaitable[bool]],
        caught_up: Callable[[], Awaitable[bool]],
    ) -> bool:
        """The processor's transactions until drained (True), or until one ends unknown (its
        producer is made anew: True if the consumer was rewound, False if it must be made
        anew too). `poll` gives inputs `[partition, offset, value]` (None: the consumer
        failed); `transform` runs one transaction of them: "ok-commit", "ended" (certainly not
        committed) or "info" (unknown); `caught_up`, with nothing read once the writer
        stopped, says whether the group committed every input to its end."""
        while not self.drained.is_set():
            inputs = await poll()
            if inputs is None:
                return False
            read_ms = self._clock_ms()
            if not inputs:
                if self.stopping.is_set() and await caught_up():
                    self.drained.set()
                continue
            outcome = await transform(inputs, read_ms, next(numbers))
            if outcome == "ok-commit":
                continue
            rewound = await rewind()
            if outcome == "info" or not rewound:
                return rewound  # a new producer (and, not rewound, a new consumer)
        return True

    async def standing(
        self, committed: Mapping[int, int], positions: Mapping[int, int]
    ) -> Literal["caught-up", "behind", "reading"]:
        """Where the processor stands against each input partition's last stable offset,
        from the group's `committed` offsets and the consumer's `positions` (by partition):
        "caught-up" when every one is committed; "behind" when the consumer read to each but
        only aborted records lay past some commit (no input: no transaction of outputs moved
        the offsets over them; its positions are to be committed alone, as Kafka Streams
        commits); "reading" while there is still to read, or an offset could not be had."""
        behind = False
        for partition in range(self.partitions):
            error, lso = await self.offset(TXN_TOPIC, partition, read_committed=True)
            if error:
                return "reading"
            if committed.get(partition, -1) < lso:
                if positions.get(partition, -1) < lso:
                    return "reading"
                behind = True
        return "behind" if behind else "caught-up"

    # -- the watcher -----------------------------------------------------------------------------

    async def run_watcher(self, process: str) -> None:
        while not self.drained.is_set():
            await self.watch_once(process, final=False)
            await asyncio.sleep(WATCH_INTERVAL_S)

    async def watch_once(self, process: str, *, final: bool) -> bool:
        """One look at every partition's LSO and high watermark: whether none is held."""
        settled = True
        for topic in (TXN_TOPIC, OUT_TOPIC):
            for partition in range(self.partitions):
                error, lso = await self.offset(topic, partition, read_committed=True)
                hw_error, hw = await self.offset(topic, partition, read_committed=False)
                if error or hw_error:
                    settled = False
                    continue
                self.event(
                    "ok", process, "lso", topic=topic, partition=partition, lso=lso, hw=hw,
                    final=final,
                )  # fmt: skip
                settled = settled and lso == hw
        return settled

    # -- after the run ---------------------------------------------------------------------------

    async def finish(self, process: str) -> None:
        """Every transaction ended (the LSOs caught up with the ends, or the timeout passed
        twice), then the final reads and the processor's committed offsets."""
        for _ in range(int(2 * TXN_TIMEOUT_MS / 1000 / WATCH_INTERVAL_S)):
            if await self.watch_once(process, final=False):
                break
            await asyncio.sleep(WATCH_INTERVAL_S)
        await self.watch_once(process, final=True)
        for topic in (TXN_TOPIC, OUT_TOPIC):
            for isolation in ("read_committed", "read_uncommitted"):
                read, ended = await self.read_final(topic, isolation)
                for partition, rows in enumerate(read):
                    self.event(
                        "ok", "final", "txn_read", topic=topic, partition=partition,
                        isolation=isolation, records=rows, complete=partition in ended,
                    )  # fmt: skip
        offsets = await self.committed()
        self.event("ok", "final", "ctp_committed", group=CTP_GROUP, offsets=offsets)
