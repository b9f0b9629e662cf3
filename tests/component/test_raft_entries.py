"""Log entries of a real single-replica Raft group, in process: what goes into the journal,
what a restart applies from it, and what the group refuses.

Commands go into the log as they are, behind a two-byte prefix; an entry without it (what
stock pysyncobj writes: a pickled method call) is a broken invariant, never unpickled. A group
bounds the proposals it holds in flight and refuses more with a retriable error.
"""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path

import pytest

from cluster.raft import (
    ProposalError,
    ProposalQueueFullError,
    journal,
)
from statemachine.errors import ErrorCode
from tests.cluster.raft_harness import HashChain
from tests.polling import apoll_until
from tests.raft_groups import free_port, started_group


def _unpickled(what: str) -> None:
    """What unpickling `_Trap` would call: the proof that an entry was unpickled."""
    UNPICKLED.append(what)


UNPICKLED: list[str] = []


class _Trap:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return _unpickled, ("an entry without our prefix",)


@pytest.mark.asyncio
async def test_an_entry_without_our_prefix_is_refused_and_never_unpickled(
    tmp_path: Path,
) -> None:
    """What stock pysyncobj wrote for a command (its type byte, then a pickled call) must not
    be applied, nor unpickled, here or on a restart: the replica stops at it, unhealthy."""
    UNPICKLED.clear()
    port = free_port()
    machine = HashChain()
    driver, group = await started_group(tmp_path, machine, port)
    try:
        await apoll_until(lambda: group.serving, 10, "the single replica to lead")
        assert await group.propose(b"before", timeout_s=10) == 1
        stock_entry = bytes([0]) + pickle.dumps(_Trap())  # pysyncobj's REGULAR type byte
        group._sync._append_as_leader(stock_entry, lambda _result, _error: None)
        group._sync.raftbroker_wake()
        await apoll_until(lambda: not group.status().healthy, 10, "the apply to fail")
        status = group.status()
        assert "failed ticks" in status.detail
        assert status.last_applied < status.commit_index, "stopped at the entry, not past it"
        assert machine.count == 1
    finally:
        driver.stop()

    replayed = HashChain()
    driver, group = await started_group(tmp_path, replayed, port)
    try:
        await apoll_until(lambda: not group.status().healthy, 10, "the replayed apply to fail")
        assert replayed.count == 1, "the entry before it applied again, nothing after"
    finally:
        driver.stop()
    assert UNPICKLED == []


@pytest.mark.asyncio
async def test_a_full_proposal_queue_refuses_with_a_retriable_error_of_its_own(
    tmp_path: Path,
) -> None:
    machine = HashChain()
    driver, group = await started_group(tmp_path, machine, free_port())  # 100 may be pending
    try:
        await apoll_until(lambda: group.serving, 10, "the single replica to lead")
        results: list[tuple[object, ProposalError | None]] = []
        for i in range(100):  # no await between them: none can apply meanwhile
            group.submit(i.to_bytes(4, "big"), 10, lambda r, e: results.append((r, e)))
        with pytest.raises(ProposalQueueFullError) as refused:
            group.submit(b"one too many", 10, lambda r, e: results.append((r, e)))
        assert isinstance(refused.value, ProposalError), "what the frontend and duties catch"
        assert refused.value.error is ErrorCode.THROTTLING_QUOTA_EXCEEDED
        assert refused.value.retriable
        await apoll_until(lambda: len(results) == 100, 10, "the queued proposals to apply")
        assert [r for r, _ in results] == list(range(1, 101))
        assert all(e is None for _, e in results), "the refusal failed none of them"
        assert await group.propose(b"room again", timeout_s=10) == 101
    finally:
        driver.stop()


COMMANDS = [bytes([i % 251]) * (100 + 37 * i) for i in range(200)]  # ~750 KiB in all


def digest_of(commands: list[bytes]) -> bytes:
    expected = HashChain()
    for command in commands:
        expected.apply(command, 0)
    return expected.digest


async def replayed_digest(directory: Path, port: int, count: int) -> bytes:
    """The digest of what a restarted single replica applies from its journal."""
    replayed = HashChain()
    driver, _group = await started_group(directory, replayed, port)
    try:
        await apoll_until(lambda: replayed.count >= count, 10, "the journal to be applied again")
        return replayed.digest
    finally:
        driver.stop()


@pytest.mark.asyncio
async def test_every_entry_is_replayed_after_a_restart(tmp_path: Path) -> None:
    port = free_port()
    first = HashChain()
    driver, group = await started_group(tmp_path, first, port)
    try:
        await apoll_until(lambda: group.serving, 10, "the single replica to lead")
        for start in range(0, len(COMMANDS), 20):
            await asyncio.gather(*(group.propose(c, timeout_s=10) for c in COMMANDS[start:][:20]))
        digest = first.digest
    finally:
        driver.stop()
    assert (tmp_path / journal.LOG_NAME).stat().st_size > 512 * 1024
    assert digest == digest_of(COMMANDS), "each entry applied once, in order"
    assert await replayed_digest(tmp_path, port, len(COMMANDS)) == digest
