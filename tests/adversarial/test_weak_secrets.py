"""Issue 19, defect 6: a node never starts with a placeholder or guessable cluster secret.

The value once committed in `compose/node*.toml` (`change-me-0123456789abcdef`) passed the only
check there was, its length, so every cluster started from those files shared a secret anyone
could read. Here real `raftbroker node` processes are started with such secrets, as an operator
who copied a config would start them: each must exit at once with one line naming the setting
and how to make a good secret, before it binds any port. The same config with a secret drawn
as `cluster up` draws one starts and serves (the positive control).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.local import launcher
from tests.polling import poll_until

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
WEAK = (
    "change-me-0123456789abcdef",  # the placeholder once committed in compose/node*.toml
    "changeme-changeme-changeme",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "0123456789012345678901",
    "short",
)


def node_ports() -> launcher.Ports:
    return launcher.choose_ports(1, seed=19_006)


@pytest.mark.parametrize("secret", WEAK)
def test_a_node_refuses_a_weak_secret_in_one_line(tmp_path: Path, secret: str) -> None:
    ports = node_ports()
    (config,) = launcher.write_configs(tmp_path, 1, ports, secret)
    done = subprocess.run(
        [sys.executable, "-m", "cli", "node", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        check=False,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "cluster_secret" in lines[0], lines[0]
    assert "Traceback" not in done.stderr + done.stdout
    host = launcher.host_of(0)
    assert all(launcher.port_free(host, port) for port in ports), "bound before refusing"


def test_a_node_with_a_drawn_secret_starts(tmp_path: Path) -> None:
    ports = node_ports()
    (config,) = launcher.write_configs(tmp_path, 1, ports, launcher.new_secret())
    pid = launcher.start_node(config, tmp_path / "node1.log")
    try:
        host = launcher.host_of(0)
        poll_until(
            lambda: not launcher.port_free(host, ports.client),
            START_TIMEOUT_S,
            "the node with a good secret listening",
        )
    finally:
        launcher.kill(pid, signal.SIGTERM, wait_s=STOP_TIMEOUT_S)
        assert not launcher.alive(pid)
