"""Real processes on loopback for cluster tests: start, wait with deadlines, stop by PID."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from cluster.local import launcher

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
