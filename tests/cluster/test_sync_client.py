"""The synchronous wrapper, end to end against the module's 3-node cluster."""

from __future__ import annotations

from cluster.client.sync import SyncClient
from cluster.local import launcher


def test_sync_client_produces_and_consumes_in_order(
    three_nodes: launcher.LocalCluster,
) -> None:
    with SyncClient(three_nodes.bootstrap) as client:
        client.create_topic("scripted", partitions=2, replication_factor=3)
        with client.producer() as producer:
            futures = [producer.send("scripted", f"s{i}".encode(), key=b"same") for i in range(200)]
            offsets = [f.result(timeout=30).offset for f in futures]
        assert offsets == list(range(200))  # one key: one partition, in send order
        records = client.consume("scripted", max_records=200)
        assert [r.value for r in sorted(records, key=lambda r: r.offset)] == [
            f"s{i}".encode() for i in range(200)
        ]
        status = client.cluster_status()
        assert status.node_id in {n.node_id for n in three_nodes.nodes}
        described = client.describe_producers("scripted")
        assert sum(len(d.producers) for d in described) == 1
