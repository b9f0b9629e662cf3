"""An Apache Kafka cluster for one scenario: three KRaft nodes from Maven Central's jars alone.

Role: the first peer of the benchmark (`bench.kafka` runs its cases against it and against
raftbroker's Kafka listener in the same run). `fresh_cluster` writes a server.properties per
node (combined mode: broker and controller in one process, a static 3-voter quorum, 127.0.0.2-4
as raftbroker's nodes use), formats each log directory with `kafka.tools.StorageTool format`,
starts `kafka.Kafka` with a fixed heap (`HEAP_MB`, Kafka's own default of 1 GiB), waits until
the cluster lists every broker, and stops each by PID (SIGTERM, then SIGKILL) in a `finally`.
`create_topic` creates a topic with replication 3 and `min.insync.replicas` 2 and returns once
every partition has a leader and all three replicas in sync.

Settings are stated so the comparison is fair: acknowledgements from the page cache unless
`fsync` (then `log.flush.interval.messages=1`: leader and followers fsync every append before
an acks=all answer, as raftbroker's `fsync = true`), a new group's rebalance delay 0 (Kafka's
development default), no automatic topic creation.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from bench.harness import log_tails as harness_log_tails
from bench.harness import poll_until, reporter
from bench.java import Jars, classpath
from cluster.local import launcher

NODES = 3
REPLICATION = 3
MIN_INSYNC_REPLICAS = 2
HEAP_MB = 1024
FORMAT_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
ADMIN_TIMEOUT_S = 10.0
LOG_TAIL_LINES = 12

progress = reporter("bench.apache_kafka")

LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.kafka.name = org.apache.kafka
logger.kafka.level = INFO
"""


@dataclass(slots=True)
class Broker:
    node_id: int
    host: str
    config: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Signal the JVM and wait for it to exit (SIGKILL if it has not in STOP_TIMEOUT_S)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(STOP_TIMEOUT_S)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT_S)


@dataclass(slots=True)
class ApacheKafkaCluster:
    brokers: list[Broker]
    port: int
    jars: Jars
    # One admin client for the cluster's life: a future of a client already collected fails
    # with _DESTROY, so none is made per call.
    _admin: AdminClient | None = None

    @property
    def bootstrap(self) -> list[str]:
        return [f"{b.host}:{self.port}" for b in self.brokers]

    def pids(self) -> dict[str, int]:
        return {f"kafka{b.node_id}": b.pid for b in self.brokers}

    def broker(self, node_id: int) -> Broker:
        return next(b for b in self.brokers if b.node_id == node_id)

    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": ",".join(self.bootstrap)})
        return self._admin


def server_properties(
    node_id: int, hosts: Sequence[str], ports: tuple[int, int], log_dir: Path, *, fsync: bool
) -> str:
    port, controller_port = ports
    host = hosts[node_id - 1]
    voters = ",".join(f"{i + 1}@{h}:{controller_port}" for i, h in enumerate(hosts))
    lines = [
        "process.roles=broker,controller",
        f"node.id={node_id}",
        f"controller.quorum.voters={voters}",
        f"listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
        f"advertised.listeners=PLAINTEXT://{host}:{port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        f"log.dirs={log_dir}",
        f"default.replication.factor={REPLICATION}",
        f"min.insync.replicas={MIN_INSYNC_REPLICAS}",
        f"offsets.topic.replication.factor={REPLICATION}",
        f"transaction.state.log.replication.factor={REPLICATION}",
        f"transaction.state.log.min.isr={MIN_INSYNC_REPLICAS}",
        "group.initial.rebalance.delay.ms=0",
        "auto.create.topics.enable=false",
    ]
    if fsync:
        lines.append("log.flush.interval.messages=1")
    return "\n".join(lines) + "\n"


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (as
    `kafka-storage random-uuid` prints)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def format_storage(jars: Jars, broker: Broker, cluster_id: str, log4j: Path) -> None:
    done = subprocess.run(
        jars.java(
            # "--cluster-id=": an id may start with "-" (base64url), which the tool's
            # argument parser would take for an option (a run failed so: 1 in 64 ids).
            "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}",
            "-c", str(broker.config),
            heap_mb=256, system={"log4j2.configurationFile": str(log4j)},
        ),
        capture_output=True, text=True, timeout=FORMAT_TIMEOUT_S, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"kafka-storage format of node {broker.node_id}: {done.stderr[-2000:]}")


def start(jars: Jars, broker: Broker, log4j: Path) -> None:
    with broker.log.open("ab") as log:
        broker.proc = subprocess.Popen(
            jars.java(
                "kafka.Kafka", str(broker.config), heap_mb=HEAP_MB,
                system={"log4j2.configurationFile": str(log4j)},
            ),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


@contextlib.asynccontextmanager
async def fresh_cluster(*, fsync: bool = False) -> AsyncIterator[ApacheKafkaCluster]:
    """Three Apache Kafka nodes in a temporary directory, every broker registered; stopped by
    PID and removed after (a failure carries the nodes' log tails)."""
    jars = await asyncio.to_thread(classpath)
    root = Path(tempfile.mkdtemp(prefix="raftbroker-bench-kafka-"))
    port, _, controller_port, _ = launcher.choose_ports(NODES, int(time.time()) + 7)
    hosts = [launcher.host_of(i) for i in range(NODES)]
    log4j = root / "log4j2.properties"
    log4j.write_text(LOG4J2)
    brokers = []
    for node_id in range(1, NODES + 1):
        config = root / f"kafka{node_id}.properties"
        props = server_properties(
            node_id, hosts, (port, controller_port), root / f"kafka{node_id}", fsync=fsync
        )
        config.write_text(props)
        brokers.append(Broker(node_id, hosts[node_id - 1], config, root / f"kafka{node_id}.log"))
    cluster = ApacheKafkaCluster(brokers, port, jars)
    try:
        cluster_id = new_cluster_id()
        await asyncio.gather(
            *(asyncio.to_thread(format_storage, jars, b, cluster_id, log4j) for b in brokers)
        )
        for broker in brokers:
            start(jars, broker, log4j)
        await wait_ready(cluster)
        yield cluster
    except BaseException as exc:
        exc.add_note(log_tails(brokers))
        raise
    finally:
        # Every node is stopped and the directory removed even if one stop fails.
        await asyncio.gather(*(asyncio.to_thread(b.stop) for b in brokers), return_exceptions=True)
        shutil.rmtree(root, ignore_errors=True)


def log_tails(brokers: Sequence[Broker]) -> str:
    return harness_log_tails((b.log for b in brokers), LOG_TAIL_LINES)


def _registered(cluster: ApacheKafkaCluster) -> int:
    for broker in cluster.brokers:
        assert broker.proc is not None
        if broker.proc.poll() is not None:
            raise RuntimeError(f"kafka{broker.node_id} exited with {broker.proc.returncode}")
    try:
        described = cluster.admin().describe_cluster(request_timeout=ADMIN_TIMEOUT_S)
        return len(described.result(ADMIN_TIMEOUT_S).nodes)
    except (KafkaException, TimeoutError):  # not listening yet, or no controller yet
        return 0


async def wait_ready(cluster: ApacheKafkaCluster) -> None:
    """Until the cluster lists every broker (a node that exited fails at once)."""

    async def ready() -> bool:
        return await asyncio.to_thread(_registered, cluster) == NODES

    await poll_until(ready, "Apache Kafka: every broker registered")


def _in_sync(cluster: ApacheKafkaCluster, topic: str, partitions: int) -> bool:
    try:
        meta = cluster.admin().list_topics(topic, timeout=ADMIN_TIMEOUT_S)
    except KafkaException:
        return False
    found = meta.topics.get(topic)
    if found is None or found.error is not None or len(found.partitions) != partitions:
        return False
    return all(p.leader >= 0 and len(p.isrs) == REPLICATION for p in found.partitions.values())


async def create_topic(cluster: ApacheKafkaCluster, topic: str, partitions: int) -> None:
    """Create `topic` (replication 3, `min.insync.replicas` 2) and wait until every partition
    has a leader and three replicas in sync."""
    new = NewTopic(
        topic, partitions, REPLICATION, config={"min.insync.replicas": str(MIN_INSYNC_REPLICAS)}
    )
    futures = cluster.admin().create_topics([new], request_timeout=ADMIN_TIMEOUT_S)
    await asyncio.to_thread(futures[topic].result, ADMIN_TIMEOUT_S)

    async def in_sync() -> bool:
        return await asyncio.to_thread(_in_sync, cluster, topic, partitions)

    await poll_until(in_sync, f"Apache Kafka: {topic} led and in sync")


def describe(jars: Jars, *, fsync: bool) -> dict[str, object]:
    """The settings a report states for this side."""
    return {
        **jars.describe(),
        "mode": "KRaft combined (broker + controller per node), 3 voters",
        "heap_mb": HEAP_MB,
        "replication": REPLICATION,
        "min.insync.replicas": MIN_INSYNC_REPLICAS,
        "log.flush.interval.messages": 1 if fsync else "default (page cache)",
    }
