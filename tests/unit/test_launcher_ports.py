"""The local cluster's ports: four per node (native, HTTP, Raft, Kafka), Kafka's conventional
9092 and the native protocol's 9192, and a cluster.json written before the Kafka listener (no
`kafka_port`) still read, its next `up` giving the nodes a Kafka port."""

from __future__ import annotations

import json
from pathlib import Path

from cluster.local import launcher


def test_conventional_ports_put_kafka_on_9092_and_the_native_protocol_on_9192() -> None:
    assert launcher.CONVENTIONAL_PORTS.kafka == 9092
    assert launcher.CONVENTIONAL_PORTS.client == 9192
    assert len(set(launcher.CONVENTIONAL_PORTS)) == 4


def test_configs_name_every_nodes_kafka_port(tmp_path: Path) -> None:
    ports = launcher.Ports(12_000, 12_001, 12_010, 12_002)
    paths = launcher.write_configs(tmp_path, 2, ports, None)
    text = paths[1].read_text()
    assert "kafka_port = 12002\n" in text.split("[[peers]]")[0]
    assert text.count("kafka_port = 12002") == 3  # its own, and each of the two peers'


def test_a_cluster_json_from_before_the_kafka_listener(tmp_path: Path) -> None:
    nodes = [
        {"node_id": 1, "host": "127.0.0.2", "client_port": 21_000, "raft_port": 21_010,
         "http_port": 21_001, "pid": 1, "start_ticks": 0},
    ]  # fmt: skip
    (tmp_path / launcher.STATE_FILE).write_text(json.dumps({"nodes": nodes}))
    cluster = launcher.LocalCluster.load(tmp_path)
    assert cluster is not None
    assert cluster.nodes[0].kafka_port == 0
    assert cluster.kafka_bootstrap == []  # no Kafka listener recorded
    ports = launcher._recorded_ports(cluster.nodes[0], 1)
    assert ports[:3] == (21_000, 21_001, 21_010)
    assert ports.kafka not in (0, 21_000, 21_001, 21_010)
