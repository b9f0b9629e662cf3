"""Log entries of a real single-replica Raft group, in process: what goes into the journal and
what a restart applies from it.

Commands go into the log as they are, behind a two-byte prefix; entries written by earlier
versions (a pickled call of `apply_command`) must still apply when a node restarts on an old
journal, in log order with the new ones.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from cluster.config import Timing
from cluster.raft import GroupSpec, RaftDriver, RaftGroup
from cluster.raft.mesh import MeshSettings
from tests.cluster.raft_harness import HashChain

HOST = "127.0.0.2"


async def started_group(
    directory: Path,
    machine: HashChain,
    port: int,
    *,
    host: str = HOST,
    peers: tuple[str, ...] = (),
    name: str = "entries",
) -> tuple[RaftDriver, RaftGroup]:
    """A replica of group `name` at `host:port` (peers: their addresses), on this loop."""
    address = f"{host}:{port}"
    settings = MeshSettings(
        address,
        frozenset(peers),
        secret=None,
        frame_bytes_max=1 << 20,
        queue_bytes_max=8 << 20,
        timeout_s=2.5,
        retry_s=0.1,
        ping_s=0.1,
    )
    driver = RaftDriver(Timing(), settings, compaction_entries=1_000_000)
    driver.start()
    spec = GroupSpec(name, address, peers, directory, name)
    group = await driver.add_group(spec, machine, max_pending=100)
    return driver, group


async def until(predicate: object, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)  # polling the replica, bounded by the deadline


def free_port() -> int:
    import socket  # noqa: PLC0415 - only this helper needs it

    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.asyncio
async def test_old_pickled_entries_and_new_entries_apply_in_order_after_a_restart(
    tmp_path: Path,
) -> None:
    port = free_port()
    first = HashChain()
    driver, group = await started_group(tmp_path, first, port)
    try:
        await until(lambda: group.serving, "the single replica to lead")
        base = first.count  # pysyncobj's own entries apply nowhere near the machine
        # An entry as earlier versions wrote it: pysyncobj's pickled call of the method.
        old_done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        group._sync.apply_command(
            b"old-format", callback=lambda result, _error: old_done.set_result(result)
        )
        group._sync.raftbroker_wake()
        assert await asyncio.wait_for(old_done, 10) == base + 1
        assert await group.propose(b"new-format", timeout_s=10) == base + 2
        digest = first.digest
    finally:
        driver.stop()

    replayed = HashChain()
    driver, group = await started_group(tmp_path, replayed, port)
    try:
        await until(lambda: replayed.count == base + 2, "the journal to be applied again")
        assert replayed.digest == digest, "the same commands, in the same order"
    finally:
        driver.stop()
    expected = HashChain()
    for command in (b"old-format", b"new-format"):
        expected.apply(command)
    assert base == 0 and digest == expected.digest, "each applied as it was proposed"


@pytest.mark.asyncio
async def test_a_journal_that_grew_many_times_replays_every_entry_after_a_restart(
    tmp_path: Path,
) -> None:
    """The journal file starts at 1 KiB and doubles as entries arrive; entries written in place
    (without asking the file its size) and across each growth must all come back."""
    port = free_port()
    first = HashChain()
    commands = [bytes([i % 251]) * (100 + 37 * i) for i in range(200)]  # ~750 KiB in all
    driver, group = await started_group(tmp_path, first, port)
    try:
        await until(lambda: group.serving, "the single replica to lead")
        for start in range(0, len(commands), 20):
            await asyncio.gather(*(group.propose(c, timeout_s=10) for c in commands[start:][:20]))
        digest = first.digest
    finally:
        driver.stop()
    assert (tmp_path / "raft.journal").stat().st_size > 512 * 1024, "it grew past 1 KiB"

    replayed = HashChain()
    driver, group = await started_group(tmp_path, replayed, port)
    try:
        await until(lambda: replayed.count == len(commands), "the journal to be applied again")
        assert replayed.digest == digest
    finally:
        driver.stop()
    expected = HashChain()
    for command in commands:
        expected.apply(command)
    assert digest == expected.digest, "each entry applied once, in order"
