"""Node configuration is validated with messages that name the setting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cli.main import app
from cli.runtime import load_node_config
from cluster.config import ConfigError, Limits, NodeConfig, Timing, check_cluster_secret
from cluster.local import launcher

GOOD_SECRET = "hJ3kz9-QwX_v27LpRt0cYb"  # secrets.token_urlsafe(16), once


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
        ({"timing": {"answer_timeout_ms": 10_000}}, "answer_timeout_ms"),
        ({"limits": {"answer_bytes_per_connection_max": 1_024}}, "answer_bytes_per_connection"),
        ({"peers": []}, "peers must include this node"),
        ({"kafka_port": 70_000}, "kafka_port must be a port number"),
        ({"kafka_port": 9092}, "must differ"),
        ({"kafka_port": 9093}, "node 1 has no kafka_port"),
        (
            {
                "kafka_port": 9093,
                "peers": [
                    {"node_id": 1, "host": "h", "client_port": 1, "raft_port": 2, "kafka_port": 4}
                ],
            },
            "this node's kafka_port is 9093, not 4",
        ),
        ({"data_dir": 5}, "data_dir"),
        ({"kafka_external_port": 29092}, "node 1 has no kafka_external_address"),
        (
            {
                "peers": [
                    {
                        "node_id": 1,
                        "host": "h",
                        "client_port": 1,
                        "raft_port": 2,
                        "kafka_external_address": "no-port",
                    }
                ],
            },
            "node 1's kafka_external_address: 'no-port' is not host:port",
        ),
        ({"topics": {"auto_create": "yes"}}, "Topics.auto_create must be true or false"),
        ({"topics": {"default_partitions": 0}}, "Topics.default_partitions must be a positive"),
        ({"topics": {"default_replication_factor": True}}, "default_replication_factor"),
        ({"topics": {"num_partitions": 3}}, "unknown Topics settings"),
    ],
)
def test_invalid_settings_are_named(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        NodeConfig.from_mapping(mapping(**overrides))


def test_kafka_ports_of_every_peer() -> None:
    peers = [
        {
            "node_id": 1,
            "host": "127.0.0.2",
            "client_port": 9192,
            "raft_port": 2,
            "kafka_port": 9092,
        },
        {"node_id": 2, "host": "127.0.0.3", "client_port": 9192, "raft_port": 2, "kafka_port": 9},
    ]
    config = NodeConfig.from_mapping(mapping(client_port=9192, kafka_port=9092, peers=peers))
    assert config.kafka_address == "127.0.0.2:9092"
    assert [p.kafka_address for p in config.peers] == ["127.0.0.2:9092", "127.0.0.3:9"]
    assert NodeConfig.from_mapping(mapping()).kafka_address is None  # no Kafka listener


def test_a_non_loopback_node_with_a_secret_is_valid() -> None:
    config = NodeConfig.from_mapping(
        mapping(
            host="10.0.0.5",
            cluster_secret=GOOD_SECRET,
            peers=[{"node_id": 1, "host": "10.0.0.5", "client_port": 1, "raft_port": 2}],
        )
    )
    assert config.cluster_secret == GOOD_SECRET


@pytest.mark.parametrize(
    ("secret", "reason"),
    [
        ("change-me-0123456789abcdef", "placeholder"),  # compose's old committed value
        ("changeme-changeme-changeme", "placeholder"),
        ("password1234567890", "placeholder"),
        ("our-cluster-secret-2026!", "placeholder"),
        ("s" * 24, "8 distinct characters"),
        ("ab12ab12ab12ab12ab12", "8 distinct characters"),
        ("abcdefghijklmnopqrstuvwxyz", "guessable"),
        ("0123456789012345678901", "guessable"),
        ("qwertyuiqwertyuiqwertyui", "guessable"),  # one period of 8 counts
    ],
)
def test_weak_cluster_secrets_are_refused_in_one_line(secret: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason) as refused:
        check_cluster_secret(secret)
    message = str(refused.value)
    assert message.startswith("cluster_secret ")
    assert "secrets.token_urlsafe(32)" in message
    assert "\n" not in message
    with pytest.raises(ConfigError, match=reason):
        NodeConfig.from_mapping(mapping(cluster_secret=secret))


@pytest.mark.parametrize(
    "secret",
    [
        GOOD_SECRET,
        "n4Vq0cW-8rZ_xYt1Lk2mPsD3fGh5jK6uEo7iA9bBCd0",  # secrets.token_urlsafe(32)
        "9f86d081884c7d659a2feaa0c55ad015",  # secrets.token_hex(16)
        "correct horse battery staple 93!",
    ],
)
def test_strong_cluster_secrets_are_accepted(secret: str) -> None:
    check_cluster_secret(secret)


def test_the_local_launchers_secrets_are_accepted(tmp_path: Path) -> None:
    for i in range(200):  # each `up` of a fresh cluster draws one
        launcher.write_configs(tmp_path, 1, launcher.CONVENTIONAL_PORTS, launcher.new_secret())
        config = load_node_config(tmp_path / "node1.toml")
        assert config.cluster_secret is not None, i


def test_the_secret_can_come_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text(GOOD_SECRET + "\n")
    node = tmp_path / "node.toml"
    base = 'node_id = 1\nhost = "10.0.0.5"\nclient_port = 1\nraft_port = 2\nhttp_port = 3\n'
    base += 'data_dir = "/tmp/x"\n'
    peers = '[[peers]]\nnode_id = 1\nhost = "10.0.0.5"\nclient_port = 1\nraft_port = 2\n'
    node.write_text(f'{base}cluster_secret_file = "{tmp_path / "secret"}"\n{peers}')
    assert load_node_config(node).cluster_secret == GOOD_SECRET
    node.write_text(f'{base}cluster_secret_file = "{tmp_path / "absent"}"\n{peers}')
    with pytest.raises(ConfigError, match="cluster_secret_file: cannot read"):
        load_node_config(node)
    node.write_text(
        f'{base}cluster_secret = "{GOOD_SECRET}"\n'
        f'cluster_secret_file = "{tmp_path / "secret"}"\n{peers}'
    )
    with pytest.raises(ConfigError, match="not both"):
        load_node_config(node)
    (tmp_path / "secret").write_text("change-me-0123456789abcdef\n")
    node.write_text(f'{base}cluster_secret_file = "{tmp_path / "secret"}"\n{peers}')
    with pytest.raises(ConfigError, match="placeholder"):
        load_node_config(node)


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
