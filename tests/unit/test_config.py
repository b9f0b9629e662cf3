"""Node configuration is validated with messages that name the setting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cli.main import app
from cluster.config import ConfigError, Limits, NodeConfig, Timing


def mapping(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "node_id": 1,
        "host": "127.0.0.2",
        "client_port": 9092,
        "raft_port": 19092,
        "http_port": 8092,
        "data_dir": "/tmp/raftbroker-test",
        "peers": [{"node_id": 1, "host": "127.0.0.2", "client_port": 9092, "raft_port": 19092}],
    }
    base.update(overrides)
    return base


def test_a_loopback_node_without_secret_is_valid() -> None:
    config = NodeConfig.from_mapping(mapping(timing={"heartbeat_ms": 50}))
    assert config.timing.heartbeat_ms == 50
    assert config.self_peer.raft_address == "127.0.0.2:19092"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"host": "10.0.0.5"}, "cluster_secret"),
        ({"host": "10.0.0.5", "cluster_secret": "short"}, "16 characters"),
        ({"client_port": 70_000}, "client_port"),
        ({"surprise": 1}, "unknown settings"),
        ({"limits": {"frame_bytes_max": 0}}, "frame_bytes_max"),
        ({"limits": {"http_head_bytes_max": 512}}, "at least 1 KiB"),
        ({"limits": {"nonsense": 1}}, "unknown Limits settings"),
        ({"timing": {"election_timeout_ms_min": 200}}, "3 heartbeats"),
        ({"peers": []}, "peers must include this node"),
        ({"data_dir": 5}, "data_dir"),
    ],
)
def test_invalid_settings_are_named(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        NodeConfig.from_mapping(mapping(**overrides))


def test_a_non_loopback_node_with_a_secret_is_valid() -> None:
    config = NodeConfig.from_mapping(
        mapping(
            host="10.0.0.5",
            cluster_secret="s" * 24,
            peers=[{"node_id": 1, "host": "10.0.0.5", "client_port": 1, "raft_port": 2}],
        )
    )
    assert config.cluster_secret == "s" * 24


def test_limits_and_timing_defaults_are_consistent() -> None:
    assert Limits().fetch_bytes_max < Limits().frame_bytes_max
    assert Timing().connection_timeout_ms >= Timing().election_timeout_ms_max


def test_node_command_reports_a_bad_config_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "node.toml"
    bad.write_text('node_id = 1\nhost = "10.1.1.1"\n')
    result = CliRunner().invoke(app, ["node", "--config", str(bad)])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0
    assert "raftbroker:" in result.output
    missing = CliRunner().invoke(app, ["node", "--config", str(tmp_path / "absent.toml")])
    assert missing.exit_code == 2
    assert "cannot read" in missing.output
