"""Real processes on loopback for cluster tests: start, wait with deadlines, stop by PID."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from cluster.client import Client
from cluster.local import launcher
from tests.polling import apoll_until

REPO = Path(__file__).resolve().parents[2]


def spawn(args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start `python -m ...` from the repository root, output to `log_path`."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as log:  # the child writes to its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, *args], cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env
        )


def stop_recorded_cluster(data_dir: Path) -> None:
    """Stop whatever cluster `data_dir`'s cluster.json records: a test's last word, whatever
    the command under test (`cluster down`, say) left running."""
    cluster = launcher.LocalCluster.load(data_dir)
    if cluster is not None:
        launcher.down(cluster)


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout_s: float = 10) -> None:
    """Stop one process by PID; SIGKILL if it does not exit in time."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)


@contextlib.contextmanager
def running(procs: list[subprocess.Popen[bytes]]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Leave nothing running: every process is stopped when the block exits."""
    try:
        yield procs
    finally:
        for proc in procs:
            stop(proc, signal.SIGKILL)


def restore(cluster: launcher.LocalCluster) -> None:
    """Restart every dead node of `cluster` (as cluster.json has it now) and wait until it is
    whole again."""
    current = cluster.current()
    for node in current.nodes:
        if not launcher.alive(node.pid):
            current = launcher.restart_node(current, node.node_id)
    asyncio.run(launcher.wait_ready(current, 60))


async def partition_leader(bootstrap: list[str], topic: str, partition: int) -> int:
    """The node leading `topic`-`partition`, once one does (and the topic is known)."""
    client = Client(bootstrap, request_timeout_s=5)

    async def known() -> int:  # 0 (falsy) while there is none: node ids start at 1
        partitions = (await client.refresh([topic])).topics[0].partitions
        return max(0, partitions[partition].leader_id) if len(partitions) > partition else 0

    try:
        return await apoll_until(known, 30, f"a leader for {topic}-{partition}")
    finally:
        await client.close()
