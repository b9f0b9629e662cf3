"""A whole broker process, composed: node, its periodic duties, consumer groups, peers, the
client listeners (the native protocol's, and Kafka's when `kafka_port` is set), HTTP endpoint.

The composition root, above the broker core (cluster/broker/) and the listeners on it: the
core never imports a listener (tests/unit/test_import_directions.py), only this module joins
them.

`run_node` runs until cancelled, in one TaskGroup (structured concurrency: no task outlives
the node), and stops the Raft driver and closes every store on the way out.
"""

from __future__ import annotations

import asyncio
import logging

from cluster.addresses import join_address
from cluster.broker.core import Broker
from cluster.broker.duties import NodeDuties
from cluster.broker.groups import GroupService
from cluster.broker.metrics import HttpEndpoint, Metrics, RaftPortStats
from cluster.broker.node import Node
from cluster.broker.peers import PeerWatcher
from cluster.broker.replica import Fatal
from cluster.broker.server import Server
from cluster.config import NodeConfig
from cluster.kafka.frontend import KafkaFrontend
from cluster.kafka.messages import KafkaRequest, ResponseBody
from cluster.kafka.wire import KafkaWire
from cluster.native.frontend import NativeFrontend
from cluster.native.peer_talk import NativePeerTalk
from cluster.native.wire import NativeWire
from cluster.peer_hosts import PeerHosts

log = logging.getLogger(__name__)
LEADER_WATCH_INTERVAL_S = 0.5


async def run_node(config: NodeConfig, fatal: Fatal, ready: asyncio.Event | None = None) -> None:
    hosts = PeerHosts(
        (p for p in config.peers if p.node_id != config.node_id),
        config.timing.peer_resolve_interval_ms / 1000,
    )
    node = Node(config, fatal, hosts)
    metrics = Metrics()
    talk = NativePeerTalk(config)
    peers = PeerWatcher(config, talk)
    duties = NodeDuties(node, talk)
    groups = GroupService(node, peers)
    broker = Broker(node, peers, metrics)
    server = Server(
        NativeFrontend(broker, groups),
        config.host,
        config.client_port,
        config.limits,
        config.timing,
        wire=NativeWire(config.limits),
        peer_sources=hosts,
    )
    kafka_listeners: list[tuple[Server[KafkaRequest, ResponseBody], str]] = []
    for port, external in ((config.kafka_port, False), (config.kafka_external_port, True)):
        if port is None:
            continue
        name = "kafka_external" if external else "kafka"
        kafka_frontend = KafkaFrontend(broker, groups, external=external)
        listener = Server(
            kafka_frontend,
            config.host,
            port,
            config.limits,
            config.timing,
            wire=KafkaWire(config.limits, name=name),
            peer_sources=hosts,
        )
        kafka_listeners.append((listener, join_address(config.host, port)))
    http = HttpEndpoint(metrics, lambda: health_problems(node), config)
    await node.start()
    metrics.watch_groups(node.group_statuses)
    metrics.watch_connections(server.stats, *(listener.stats for listener, _ in kafka_listeners))
    mesh = node.driver.mesh
    metrics.watch_raft_port(
        lambda: RaftPortStats(
            mesh.unopened_links,
            mesh.refused_connections,
            mesh.failed_handshakes,
            mesh.messages_sent,
            mesh.messages_received,
        )
    )
    try:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(server.serve())
            tasks.create_task(http.serve())
            tasks.create_task(node.reconcile_forever())
            tasks.create_task(duties.run())
            tasks.create_task(groups.run())
            tasks.create_task(broker.txns.run())
            tasks.create_task(peers.run())
            tasks.create_task(hosts.run())
            tasks.create_task(_watch_leaders(node, metrics))
            await server.listening.wait()
            log.info("node %d serving clients on %s", config.node_id, config.client_address)
            for listener, address in kafka_listeners:
                tasks.create_task(listener.serve())
                await listener.listening.wait()
                log.info(
                    "node %d serving Kafka clients (%s) on %s",
                    config.node_id,
                    listener.wire.name,
                    address,
                )
            if ready is not None:
                ready.set()
    finally:
        try:
            await talk.close()
        finally:
            await node.stop()


def health_problems(node: Node) -> list[str]:
    problems = [f"{s.name}: {s.detail}" for s in node.group_statuses() if not s.healthy]
    if node.metadata_leader() is None:
        problems.append("no metadata leader known")
    return problems


async def _watch_leaders(node: Node, metrics: Metrics) -> None:
    leaders: dict[str, str | None] = {}
    while True:
        for status in node.group_statuses():
            if leaders.get(status.name, status.leader_address) != status.leader_address:
                metrics.leader_changes.labels(status.name).inc()
            leaders[status.name] = status.leader_address
        await asyncio.sleep(LEADER_WATCH_INTERVAL_S)
