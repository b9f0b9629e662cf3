"""Producer ids: the replicated block allocator and a broker's lease on its blocks.

`PidAllocator` is part of the metadata state: one counter, `next_producer_id`, that only moves
forward, and only inside apply. A broker's `AllocatePidBlock` entry reserves
`[start, start + block_size)` in the log before any id of it is handed out, so no id can be
given twice across leader changes and restarts; ids of a block a broker never used are simply
abandoned (gaps are fine, reuse never), as in Kafka's ZooKeeper-era ProducerIdManager.

`PidBlockLease` is a broker's in-memory view of the blocks committed to it. It is pure and not
replicated: it hands ids out, asks for the next block once 90% of the current one is used, and
answers a retriable error when it has nothing left.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from statemachine.errors import ErrorCode
from statemachine.records import INT64_MAX

PREFETCH_PERCENT = 90


class PidBlock(NamedTuple):
    """Producer ids `start .. end - 1`, reserved for one broker."""

    broker_id: int
    start: int
    end: int


class PidAllocator:
    """The replicated counter from which blocks (and single ids) are cut."""

    __slots__ = ("next_producer_id",)

    def __init__(self, next_producer_id: int = 0) -> None:
        assert 0 <= next_producer_id <= INT64_MAX + 1
        self.next_producer_id = next_producer_id

    def allocate_block(self, broker_id: int, block_size: int) -> PidBlock | ErrorCode:
        start = self.next_producer_id
        if start + block_size > INT64_MAX + 1:  # the 63-bit id space is spent
            return ErrorCode.UNKNOWN_SERVER_ERROR
        self.next_producer_id = start + block_size
        return PidBlock(broker_id, start, start + block_size)

    def allocate_one(self) -> int | ErrorCode:
        block = self.allocate_block(-1, 1)
        return block if isinstance(block, ErrorCode) else block.start


class PidBlockLease:
    """A broker's committed blocks, served in order; pure, single-threaded use."""

    __slots__ = ("_blocks", "_next_id", "_requested")

    def __init__(self) -> None:
        self._blocks: deque[PidBlock] = deque()
        self._next_id = 0
        self._requested = False

    def add_block(self, block: PidBlock) -> None:
        """A block committed for this broker (the answer to the request `wants_block` made)."""
        assert block.start < block.end
        assert not self._blocks or block.start >= self._blocks[-1].end, "blocks only move up"
        if not self._blocks:
            self._next_id = block.start
        self._blocks.append(block)
        self._requested = False

    def wants_block(self) -> bool:
        """True once (until `add_block` or `request_failed`) when a block should be requested."""
        if self._requested or len(self._blocks) > 1:
            return False
        if self._blocks:
            current = self._blocks[0]
            used = self._next_id - current.start
            if used * 100 < (current.end - current.start) * PREFETCH_PERCENT:
                return False
        self._requested = True
        return True

    def request_failed(self) -> None:
        """The block request did not commit; `wants_block` may ask again."""
        self._requested = False

    def take(self) -> int | ErrorCode:
        """The next unused producer id, or a retriable error while no block is at hand."""
        while self._blocks and self._next_id >= self._blocks[0].end:
            self._blocks.popleft()
            if self._blocks:
                self._next_id = self._blocks[0].start
        if not self._blocks:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        producer_id = self._next_id
        self._next_id += 1
        return producer_id

    @property
    def remaining(self) -> int:
        if not self._blocks:
            return 0
        rest = sum(b.end - b.start for b in list(self._blocks)[1:])
        return max(0, self._blocks[0].end - self._next_id) + rest
