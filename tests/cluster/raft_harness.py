"""One replica of a 3-node test Raft group, run as its own process by test_raft.py.

The machine hashes every command it applies into a running digest, so replicas that applied
the same log end with the same (count, digest). The replica that becomes leader proposes the
commands, pipelined with many in flight; every replica waits until it applied them all, then
writes a JSON report: applied count, digest, and how often pysyncobj warned that it truncated
already-applied entries (the symptom of the next-index rewind).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import time
from pathlib import Path

from cluster.config import Timing
from cluster.raft import GroupSpec, MeshSettings, ProposalError, RaftDriver, RaftGroup
from statemachine.codec import pack, unpack


class HashChain:
    def __init__(self) -> None:
        self.count = 0
        self.digest = b"\x00" * 32

    def apply(self, command: bytes | memoryview, term: int) -> object:  # noqa: ARG002
        self.count += 1
        self.digest = hashlib.sha256(self.digest + command).digest()
        return self.count

    def settle(self) -> None:
        pass  # its applies have no effects outside it

    def snapshot(self) -> bytes:
        return pack([self.count, self.digest])

    def restore(self, data: bytes) -> None:
        raw = unpack(data, size_max=len(data))
        assert isinstance(raw, tuple)
        self.count, self.digest = raw


class TruncationCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.truncations = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "truncating already-applied" in record.getMessage():
            self.truncations += 1


async def propose_all(group: RaftGroup, commands: int, size: int, window: int) -> int:
    failures = 0
    semaphore = asyncio.Semaphore(window)

    async def one(i: int) -> None:
        nonlocal failures
        try:
            await group.propose(i.to_bytes(8, "big") * (size // 8), timeout_s=30)
        except ProposalError as exc:
            failures += 1
            if failures == 1:
                print("first failed proposal:", exc.error.name, flush=True)
        finally:
            semaphore.release()

    async with asyncio.TaskGroup() as tasks:
        for i in range(commands):
            # A window of tasks, not all of them at once: like a node, whose connections bound
            # what is in flight, this process drives Raft on the same loop and must not stall it.
            await semaphore.acquire()
            tasks.create_task(one(i))
    return failures


async def main(args: argparse.Namespace) -> None:
    counter = TruncationCounter()
    logging.getLogger("pysyncobj").addHandler(counter)
    logging.getLogger("pysyncobj.syncobj").addHandler(counter)
    addresses = args.addresses.split(",")
    me = addresses[args.index]
    settings = MeshSettings(
        me,
        frozenset(a for a in addresses if a != me),
        secret=None,
        frame_bytes_max=32 << 20,
        queue_bytes_max=256 << 20,
        timeout_s=2.5,
        retry_s=0.3,
        ping_s=0.1,
        # Reading in small pieces, as pysyncobj's own transport does, lets ticks run between
        # the replies of a burst: what let a stale reply rewind a leader before the fix.
        recv_bytes_per_event=16_384 if args.small_reads else 4 << 20,
    )
    driver = RaftDriver(Timing(), settings, compaction_entries=args.compaction)
    driver.start()
    machine = HashChain()
    spec = GroupSpec("test", me, tuple(a for a in addresses if a != me), Path(args.dir), "test")
    group = await driver.add_group(spec, machine, max_pending=10_000)
    deadline = time.monotonic() + args.deadline_s
    failures = 0
    proposed = False
    while time.monotonic() < deadline:
        if group.serving and not proposed:
            proposed = True
            failures = await propose_all(group, args.commands, args.size, args.window)
        applied = await group.read(lambda: machine.count)
        if applied >= args.commands:
            break
        await asyncio.sleep(0.05)  # polling the replica's progress, bounded by the deadline
    count, digest = await group.read(lambda: (machine.count, machine.digest.hex()))
    status = group.status()
    driver.stop()
    report = {
        "index": args.index,
        "count": count,
        "digest": digest,
        "truncations": counter.truncations,
        "failures": failures,
        "proposed": proposed,
        "healthy": status.healthy,
        "detail": status.detail,
    }
    await asyncio.to_thread(Path(args.out).write_text, json.dumps(report))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--addresses", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--commands", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--window", type=int, default=500)
    parser.add_argument("--compaction", type=int, default=300)
    parser.add_argument("--deadline-s", type=float, default=90)
    parser.add_argument("--small-reads", action="store_true")
    asyncio.run(main(parser.parse_args()))
