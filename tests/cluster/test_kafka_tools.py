"""Kafka's own command-line tools (kafka-tools 4.x, from Maven Central) against the Kafka
listener, as README's "Using Kafka's own tools" shows them: kafka-topics, the console producer
and consumer, kafka-consumer-groups (with --delete-offsets), kafka-get-offsets, kafka-configs
--alter, kafka-delete-records, kafka-producer-perf-test and kafka-transactions.

Each tool runs as its class on the classpath `bench.java` resolves (`tests.kafka_java`), one JVM
a call, against the module's cluster; skipped with the reason where Java or Maven is missing.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import tempfile
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType  # type: ignore[attr-defined]
from confluent_kafka.cimpl import NewTopic

from bench.java import Jars
from cluster.local import launcher
from tests.kafka_java import jars_or_skip, kafka_tool
from tests.polling import poll_until

TOPICS = "org.apache.kafka.tools.TopicCommand"
PRODUCER = "org.apache.kafka.tools.ConsoleProducer"
CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
OFFSETS = "org.apache.kafka.tools.GetOffsetShell"
PERF = "org.apache.kafka.tools.ProducerPerformance"
CONFIGS = "org.apache.kafka.tools.ConfigCommand"
DELETE_RECORDS = "org.apache.kafka.tools.DeleteRecordsCommand"
TRANSACTIONS = "org.apache.kafka.tools.TransactionsCommand"
TIMEOUT_S = 30


@pytest.fixture(scope="module")
def jars() -> Jars:
    return jars_or_skip()


@pytest.fixture(scope="module")
def bootstrap(three_nodes: launcher.LocalCluster) -> str:
    return ",".join(three_nodes.kafka_bootstrap)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-3000:]}"
    return done.stdout


def test_topics_console_producer_and_consumer_groups_and_offsets(
    jars: Jars, bootstrap: str
) -> None:
    b = ("--bootstrap-server", bootstrap)
    ok(kafka_tool(jars, TOPICS, *b, "--create", "--topic", "tools", "--partitions", "3",
                  "--replication-factor", "3"))  # fmt: skip

    def listed() -> bool:
        # Every node knows of a new topic a moment after its creation (as with Kafka): each
        # tool asks whichever node it reaches first.
        done = kafka_tool(jars, TOPICS, *b, "--list")
        return done.returncode == 0 and "tools" in done.stdout.split()

    poll_until(listed, TIMEOUT_S, "the new topic listed")
    described = poll_until(lambda: _described(jars, b), TIMEOUT_S, "the new topic described")
    assert re.search(r"Topic: tools\s+TopicId: \S+\s+PartitionCount: 3\s+ReplicationFactor: 3",
                     described), described  # fmt: skip
    lines = [f"key-{i}:value-{i}" for i in range(30)]
    ok(kafka_tool(jars, PRODUCER, *b, "--topic", "tools", "--reader-property",
                  "parse.key=true", "--reader-property", "key.separator=:",
                  stdin="\n".join(lines) + "\n"))  # fmt: skip
    consumed = ok(kafka_tool(jars, CONSUMER, *b, "--topic", "tools", "--from-beginning",
                             "--max-messages", "30", "--group", "tools-group",
                             "--formatter-property", "print.key=true",
                             "--formatter-property", "key.separator=:",
                             "--timeout-ms", "30000"))  # fmt: skip
    assert sorted(consumed.split()) == sorted(lines)
    assert "tools-group" in ok(kafka_tool(jars, GROUPS, *b, "--list")).split()
    group = ok(kafka_tool(jars, GROUPS, *b, "--describe", "--group", "tools-group"))
    rows = [line.split() for line in group.splitlines() if line.startswith("tools-group")]
    # GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG ...: every record committed.
    assert sorted(int(r[3]) for r in rows) == sorted(int(r[4]) for r in rows), group
    assert sum(int(r[4]) for r in rows) == 30 and all(r[5] == "0" for r in rows), group
    offsets = ok(kafka_tool(jars, OFFSETS, *b, "--topic", "tools"))  # "tools:P:END" a line
    assert sorted(line.rsplit(":", 2)[1] for line in offsets.split()) == ["0", "1", "2"]
    assert sum(int(line.rsplit(":", 1)[1]) for line in offsets.split()) == 30, offsets
    check_admin_tools(jars, b)
    ok(kafka_tool(jars, TOPICS, *b, "--delete", "--topic", "tools"))


def check_admin_tools(jars: Jars, b: tuple[str, ...]) -> None:
    """kafka-configs --alter, kafka-delete-records and kafka-consumer-groups --delete-offsets
    on the topic and group the console tools left (30 records, every one committed)."""
    ok(kafka_tool(jars, CONFIGS, *b, "--alter", "--entity-type", "topics", "--entity-name",
                  "tools", "--add-config", "retention.ms=3600000"))  # fmt: skip
    described = ok(kafka_tool(jars, CONFIGS, *b, "--describe", "--entity-type", "topics",
                              "--entity-name", "tools"))  # fmt: skip
    assert "retention.ms=3600000" in described, described
    compact = ("--entity-name", "tools", "--add-config", "cleanup.policy=compact")
    refused = kafka_tool(jars, CONFIGS, *b, "--alter", "--entity-type", "topics", *compact)
    assert refused.returncode != 0 and "never compacted" in refused.stdout + refused.stderr
    plan = '{"partitions": [{"topic": "tools", "partition": 0, "offset": 2}]}'
    with tempfile.NamedTemporaryFile("w", suffix=".json") as file:
        file.write(plan)
        file.flush()
        deleted = ok(kafka_tool(jars, DELETE_RECORDS, *b, "--offset-json-file", file.name))
    assert re.search(r"partition: tools-0\s+low_watermark: 2", deleted), deleted
    dropped = ok(kafka_tool(jars, GROUPS, *b, "--delete-offsets", "--group", "tools-group",
                            "--topic", "tools"))  # fmt: skip
    assert len(re.findall(r"^tools\s+\d\s+Successful", dropped, re.M)) == 3, dropped


def _described(jars: Jars, b: tuple[str, ...]) -> str | None:
    done = kafka_tool(jars, TOPICS, *b, "--describe", "--topic", "tools")
    led = "Leader: " in done.stdout and "Leader: none" not in done.stdout
    return done.stdout if done.returncode == 0 and led else None


def test_describe_configs_shows_what_the_topic_and_node_do(bootstrap: str) -> None:
    """DescribeConfigs (kafka-topics --describe and kafka-configs read it): the retention set
    at creation as the topic's own, the rest as raftbroker does it, read-only."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic("configured", 1, 3, config={"retention.ms": "60000"})
    admin.create_topics([new])["configured"].result(TIMEOUT_S)
    topic = ConfigResource(ResourceType.TOPIC, "configured")
    broker = ConfigResource(ResourceType.BROKER, "1")

    def described() -> dict[str, Any] | None:
        # Every node knows of the topic a moment after its creation (as with Kafka).
        with contextlib.suppress(KafkaException):
            found: dict[str, Any] = admin.describe_configs([topic])[topic].result(TIMEOUT_S)
            return found
        return None

    configs = poll_until(described, TIMEOUT_S, "the new topic's configs")
    assert configs["retention.ms"].value == "60000" and not configs["retention.ms"].is_default
    assert configs["retention.bytes"].value == "-1" and configs["retention.bytes"].is_default
    assert (
        configs["min.insync.replicas"].value == "2" and configs["min.insync.replicas"].is_read_only
    )
    assert configs["cleanup.policy"].value == "delete"
    assert configs["max.message.bytes"].value == str(1024 * 1024)
    node = admin.describe_configs([broker])[broker].result(TIMEOUT_S)
    assert node["default.replication.factor"].value == "3"
    missing = ConfigResource(ResourceType.TOPIC, "no-such-topic")
    with pytest.raises(KafkaException, match="UNKNOWN_TOPIC_OR_PART"):
        admin.describe_configs([missing])[missing].result(TIMEOUT_S)


def test_producer_perf_test_acks_every_record(jars: Jars, bootstrap: str) -> None:
    ok(kafka_tool(jars, TOPICS, "--bootstrap-server", bootstrap, "--create", "--topic", "perf"))
    out = ok(kafka_tool(jars, PERF, "--topic", "perf", "--num-records", "20000",
                        "--record-size", "100", "--throughput", "-1", "--producer-props",
                        f"bootstrap.servers={bootstrap}", "acks=all",
                        "enable.idempotence=true"))  # fmt: skip
    # Its last line: "20000 records sent, N records/sec (...), ... ms avg latency, ..."
    assert re.search(r"^20000 records sent, [\d.]+ records/sec", out, re.M), out


def open_transaction(
    jars: Jars, bootstrap: str, topic: str, *, partitions: int, partition: int
) -> Producer:
    """A new topic of that many partitions, and a confluent-kafka transaction (its
    transactional id the topic's name) left open with one record in `partition`."""
    ok(kafka_tool(jars, TOPICS, "--bootstrap-server", bootstrap, "--create", "--topic", topic,
                  "--partitions", str(partitions)))  # fmt: skip
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": topic})
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(topic, b"open", partition=partition)
    producer.flush(TIMEOUT_S)  # the partition is in the transaction once its data is sent
    return producer


def test_kafka_transactions_lists_and_describes_a_transaction(jars: Jars, bootstrap: str) -> None:
    """kafka-transactions (TransactionsCommand) `list`, `describe` and `describe-producers`
    a confluent-kafka transaction while it is open (its partitions, Ongoing, where it starts),
    and once it committed."""
    producer = open_transaction(jars, bootstrap, "tools-txn", partitions=2, partition=1)
    b = ("--bootstrap-server", bootstrap)
    listed = ok(kafka_tool(jars, TRANSACTIONS, *b, "list"))
    assert re.search(r"^tools-txn\s+\d+\s+\d+\s+Ongoing\s*$", listed, re.M), listed
    described = ok(kafka_tool(jars, TRANSACTIONS, *b, "describe", "--transactional-id",
                              "tools-txn"))  # fmt: skip
    assert re.search(r"\btools-txn\s+\d+\s+0\s+Ongoing\b.*\btools-txn-1\b", described), described
    # describe-producers (DescribeProducers): the open transaction starts at the record's offset
    producers = ok(kafka_tool(jars, TRANSACTIONS, *b, "describe-producers", "--topic",
                              "tools-txn", "--partition", "1"))  # fmt: skip
    # ProducerId ProducerEpoch LatestCoordinatorEpoch LastSequence LastTimestamp StartOffset
    assert re.search(r"^\d+\s+0\s+-1\s+0\s+\d+\s+0\s*$", producers, re.M), producers
    producer.commit_transaction(TIMEOUT_S)

    def committed() -> str | None:
        out = ok(kafka_tool(jars, TRANSACTIONS, *b, "describe", "--transactional-id",
                            "tools-txn"))  # fmt: skip
        return out if "CompleteCommit" in out else None

    poll_until(committed, TIMEOUT_S, "the transaction described as committed")


def test_kafka_transactions_aborts_a_hanging_transaction(jars: Jars, bootstrap: str) -> None:
    """kafka-transactions `abort` (WriteTxnMarkers from the Admin client): the producer's open
    transaction on the partition named by its start offset ends there, as an abort: the
    partition holds it open no longer (describe-producers shows no start offset), and the
    producer's own abort afterwards is a harmless replay."""
    producer = open_transaction(jars, bootstrap, "tools-hang", partitions=1, partition=0)
    b = ("--bootstrap-server", bootstrap)
    describe = ("describe-producers", "--topic", "tools-hang", "--partition", "0")
    before = ok(kafka_tool(jars, TRANSACTIONS, *b, *describe))
    assert re.search(r"^\d+\s+0\s+-1\s+0\s+\d+\s+0\s*$", before, re.M), before  # open at 0
    # find-hanging (DescribeProducers, then ListTransactions and DescribeTransactions of the
    # coordinator): open for less than a minute and known to its coordinator, it is not.
    hanging = ok(kafka_tool(jars, TRANSACTIONS, *b, "find-hanging", "--topic", "tools-hang",
                            "--max-transaction-timeout", "1"))  # fmt: skip
    lines = hanging.strip().splitlines()
    assert lines[0].split() == ["Topic", "Partition", "ProducerId", "ProducerEpoch",
                                "CoordinatorEpoch", "StartOffset", "LastTimestamp",
                                "Duration(min)"] and len(lines) == 1, hanging  # fmt: skip
    ok(kafka_tool(jars, TRANSACTIONS, *b, "abort", "--topic", "tools-hang", "--partition", "0",
                  "--start-offset", "0"))  # fmt: skip
    after = ok(kafka_tool(jars, TRANSACTIONS, *b, *describe))
    assert re.search(r"^\d+\s+0\s+\d+\s+0\s+\d+\s+None\s*$", after, re.M), after  # ended
    producer.abort_transaction(TIMEOUT_S)
