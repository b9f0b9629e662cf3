// Kafka's reference Java client (kafka-clients), driven by the test suite through a line
// protocol: one JSON request a line on stdin, one JSON answer a line on stdout (events of a
// long call, such as a produce's progress, come before its answer, each with an "event" key).
// Run as a single-file source program on the classpath `bench/java.py` resolves:
//     java -cp CLASSPATH java/ClientDriver.java BOOTSTRAP
// The client's own log goes to stderr (log4j2), where the tests read the API versions it
// negotiated. Requests:
//   {"op": "produce", "topic": T, "partition": P, "count": N, "prefix": S, "pace_ms": M}
//       an idempotent producer (acks=all) sends S-0 .. S-(N-1) to partition P, one every M ms,
//       then flushes: {"acked": N, "errors": [...], "offsets": [first, last]}
//   {"op": "transactions", "topic": T, "partitions": N, "txn_id": X, "outcomes": [true, false]}
//       a transactional producer runs one transaction an outcome, each writing "X-i-p" to
//       every partition p < N (i: the transaction's index), flushed, then committed (true)
//       or aborted (false): {"ended": k}; with "offsets_group": G, each also sends the
//       offset i + 1 of partition 0 for group G (sendOffsetsToTransaction)
//   {"op": "consume", "topic": T, "count": N, "group": G or null, "timeout_ms": M,
//       "isolation": "read_committed" or "read_uncommitted" (the default)}
//       reads from the beginning (assigned partitions without G; as member of G with manual
//       commits otherwise) until N records or M ms: {"values": [...], "partitions": [...],
//       "epochs": [...]} (each record's leader epoch, -1 for none)
//   {"op": "seek", "topic": T, "partition": P, "offset": O, "epoch": E, "count": N,
//       "timeout_ms": M}: seek to O as read in leader epoch E (the client validates that with
//       OffsetForLeaderEpoch first, KIP-320; auto.offset.reset=none) and read until N records
//       or M ms: {"values": [...]} or, when the client finds the log diverged from the
//       position, {"truncated": {"offset": O', "epoch": E'}} (LogTruncationException's)
//   {"op": "member", "topic": T, "group": G}: consume as a group member until the next line
//       of stdin (any: "stop") or the process's death: an event per record read, sent before
//       its offset is committed (a record may be reported twice, never committed unreported)
//   {"op": "admin", "action": A, ...}: create_topic, describe_topic, delete_topic,
//       describe_cluster, list_groups, describe_group, list_offsets
//   {"op": "quit"}
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.GroupListing;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.CommitFailedException;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.LogTruncationException;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.errors.RebalanceInProgressException;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class ClientDriver {
    static final ObjectMapper JSON = new ObjectMapper();
    static final long CALL_TIMEOUT_S = 60;
    final String bootstrap;

    ClientDriver(String bootstrap) {
        this.bootstrap = bootstrap;
    }

    public static void main(String[] args) throws Exception {
        ClientDriver driver = new ClientDriver(args[0]);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        emit(JSON.createObjectNode().put("event", "ready"));
        String line;
        while ((line = in.readLine()) != null) {
            JsonNode request = JSON.readTree(line);
            String op = request.path("op").asText();
            if (op.equals("quit")) {
                break;
            }
            ObjectNode answer;
            try {
                answer = driver.call(op, request, in);
            } catch (Exception e) {
                answer = JSON.createObjectNode();
                answer.put("error", e.getClass().getSimpleName() + ": " + e.getMessage());
                Throwable cause = e.getCause();
                if (cause != null) {
                    answer.put("cause", cause.getClass().getSimpleName() + ": " + cause.getMessage());
                }
            }
            emit(answer);
        }
    }

    static synchronized void emit(ObjectNode node) {
        System.out.println(node.toString());
        System.out.flush();
    }

    ObjectNode call(String op, JsonNode r, BufferedReader in) throws Exception {
        switch (op) {
            case "produce":
                return produce(r.path("topic").asText(), r.path("partition").asInt(0),
                        r.path("count").asInt(), r.path("prefix").asText("v"), r.path("pace_ms").asLong(0));
            case "consume":
                return consume(r.path("topic").asText(), r.path("count").asInt(),
                        r.hasNonNull("group") ? r.get("group").asText() : null,
                        r.path("timeout_ms").asLong(30_000),
                        r.path("isolation").asText("read_uncommitted"));
            case "transactions":
                return transactions(r.path("topic").asText(), r.path("partitions").asInt(1),
                        r.path("txn_id").asText(), r.path("outcomes"),
                        r.path("offsets_group").asText(""));
            case "seek":
                return seek(r.path("topic").asText(), r.path("partition").asInt(),
                        r.path("offset").asLong(), r.path("epoch").asInt(), r.path("count").asInt(),
                        r.path("timeout_ms").asLong(30_000));
            case "member":
                return member(r.path("topic").asText(), r.path("group").asText(), in);
            case "admin":
                return admin(r);
            default:
                throw new IllegalArgumentException("unknown op " + op);
        }
    }

    Properties base() {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("client.id", "raftbroker-java-check");
        return p;
    }

    ObjectNode produce(String topic, int partition, int count, String prefix, long paceMs) throws Exception {
        Properties p = base();
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION, "5");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "120000");
        p.put(ProducerConfig.RETRY_BACKOFF_MS_CONFIG, "50");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        List<String> errors = new CopyOnWriteArrayList<>();
        AtomicLong acked = new AtomicLong();
        AtomicLong first = new AtomicLong(-1);
        AtomicLong last = new AtomicLong(-1);
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            for (int i = 0; i < count; i++) {
                producer.send(new ProducerRecord<>(topic, partition, null, prefix + "-" + i), (meta, e) -> {
                    if (e != null) {
                        errors.add(e.getClass().getSimpleName() + ": " + e.getMessage());
                        return;
                    }
                    first.compareAndSet(-1, meta.offset());
                    last.set(meta.offset());
                    long n = acked.incrementAndGet();
                    if (n % 100 == 0) {
                        emit(JSON.createObjectNode().put("event", "acked").put("count", n));
                    }
                });
                if (paceMs > 0) {
                    Thread.sleep(paceMs);
                }
            }
            producer.flush();
        }
        ObjectNode answer = JSON.createObjectNode().put("acked", acked.get());
        ArrayNode errs = answer.putArray("errors");
        errors.stream().limit(10).forEach(errs::add);
        answer.putArray("offsets").add(first.get()).add(last.get());
        return answer;
    }

    Properties consumerProps(String group) {
        Properties p = base();
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        if (group != null) {
            p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
            p.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "3000");
            p.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "500");
        }
        return p;
    }

    ObjectNode transactions(
            String topic, int partitionCount, String txnId, JsonNode outcomes, String group) {
        Properties p = base();
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        int ended = 0;
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            producer.initTransactions();
            for (JsonNode outcome : outcomes) {
                producer.beginTransaction();
                for (int partition = 0; partition < partitionCount; partition++) {
                    String value = txnId + "-" + ended + "-" + partition;
                    producer.send(new ProducerRecord<>(topic, partition, null, value));
                }
                producer.flush();  // the data is in the partitions before the outcome
                if (!group.isEmpty()) {  // offsets in the transaction: partition 0 at i + 1
                    producer.sendOffsetsToTransaction(
                            Map.of(new TopicPartition(topic, 0), new OffsetAndMetadata(ended + 1)),
                            new ConsumerGroupMetadata(group));
                }
                if (outcome.asBoolean()) {
                    producer.commitTransaction();
                } else {
                    producer.abortTransaction();
                }
                ended++;
            }
        }
        return JSON.createObjectNode().put("ended", ended);
    }

    ObjectNode consume(String topic, int count, String group, long timeoutMs, String isolation) {
        ObjectNode answer = JSON.createObjectNode();
        ArrayNode values = answer.putArray("values");
        ArrayNode partitions = answer.putArray("partitions");
        ArrayNode epochs = answer.putArray("epochs");
        Properties props = consumerProps(group);
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            if (group == null) {
                List<TopicPartition> tps = new ArrayList<>();
                for (PartitionInfo info : consumer.partitionsFor(topic)) {
                    tps.add(new TopicPartition(topic, info.partition()));
                }
                consumer.assign(tps);
                consumer.seekToBeginning(tps);
            } else {
                consumer.subscribe(Collections.singletonList(topic));
            }
            long deadline = System.currentTimeMillis() + timeoutMs;
            while (values.size() < count && System.currentTimeMillis() < deadline) {
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(200));
                for (ConsumerRecord<String, String> record : records) {
                    values.add(record.value());
                    partitions.add(record.partition());
                    epochs.add(record.leaderEpoch().orElse(-1));
                }
                if (group != null && !records.isEmpty()) {
                    consumer.commitSync(Duration.ofSeconds(CALL_TIMEOUT_S));
                }
            }
        }
        return answer;
    }

    ObjectNode seek(String topic, int partition, long offset, int epoch, int count, long timeoutMs) {
        ObjectNode answer = JSON.createObjectNode();
        ArrayNode values = answer.putArray("values");
        Properties props = consumerProps(null);
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "none");
        TopicPartition tp = new TopicPartition(topic, partition);
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            consumer.assign(Collections.singletonList(tp));
            consumer.seek(tp, new OffsetAndMetadata(offset, Optional.of(epoch), ""));
            long deadline = System.currentTimeMillis() + timeoutMs;
            while (values.size() < count && System.currentTimeMillis() < deadline) {
                try {
                    for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(200))) {
                        values.add(record.value());
                    }
                } catch (LogTruncationException e) {
                    OffsetAndMetadata diverged = e.divergentOffsets().get(tp);
                    answer.putObject("truncated").put("offset", diverged.offset())
                            .put("epoch", diverged.leaderEpoch().orElse(-1));
                    break;
                }
            }
        }
        return answer;
    }

    // A group member that reads until stdin closes: each record is an event, sent after the
    // offsets that cover it were committed.
    ObjectNode member(String topic, String group, BufferedReader in) throws Exception {
        long read = 0;
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(consumerProps(group))) {
            consumer.subscribe(Collections.singletonList(topic));
            while (!in.ready()) { // until the next line: "stop" (its content is not read)
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(200));
                if (records.isEmpty()) {
                    continue;
                }
                // Printed before the commit: whatever was committed was printed, so a member
                // killed in between leaves records read twice at worst, never unreported.
                for (ConsumerRecord<String, String> record : records) {
                    read++;
                    emit(JSON.createObjectNode().put("event", "record").put("value", record.value())
                            .put("partition", record.partition()).put("offset", record.offset()));
                }
                try {
                    consumer.commitSync(Duration.ofSeconds(CALL_TIMEOUT_S));
                } catch (RebalanceInProgressException | CommitFailedException e) {
                    // A rebalance refused the commit: back to the first record of each batch,
                    // read again by this member if it keeps the partition, else by the new
                    // owner from the last commit.
                    for (TopicPartition tp : records.partitions()) {
                        consumer.seek(tp, records.records(tp).get(0).offset());
                    }
                }
            }
        }
        in.readLine();
        return JSON.createObjectNode().put("read", read);
    }

    ObjectNode admin(JsonNode r) throws Exception {
        Properties p = base();
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "60000");
        String action = r.path("action").asText();
        String topic = r.path("topic").asText();
        ObjectNode answer = JSON.createObjectNode();
        try (Admin admin = Admin.create(p)) {
            switch (action) {
                case "create_topic": {
                    NewTopic created = new NewTopic(topic, r.path("partitions").asInt(1),
                            (short) r.path("replication").asInt(3));
                    admin.createTopics(List.of(created)).all().get(CALL_TIMEOUT_S, TimeUnit.SECONDS);
                    break;
                }
                case "describe_topic": {
                    TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames()
                            .get(CALL_TIMEOUT_S, TimeUnit.SECONDS).get(topic);
                    ArrayNode parts = answer.put("name", d.name()).putArray("partitions");
                    for (TopicPartitionInfo info : d.partitions()) {
                        ObjectNode part = parts.addObject().put("partition", info.partition())
                                .put("leader", info.leader() == null ? -1 : info.leader().id());
                        ArrayNode replicas = part.putArray("replicas");
                        info.replicas().forEach(n -> replicas.add(n.id()));
                        ArrayNode isr = part.putArray("isr");
                        info.isr().forEach(n -> isr.add(n.id()));
                    }
                    break;
                }
                case "delete_topic":
                    admin.deleteTopics(List.of(topic)).all().get(CALL_TIMEOUT_S, TimeUnit.SECONDS);
                    break;
                case "describe_cluster": {
                    DescribeClusterResult d = admin.describeCluster();
                    answer.put("cluster_id", d.clusterId().get(CALL_TIMEOUT_S, TimeUnit.SECONDS));
                    Node controller = d.controller().get(CALL_TIMEOUT_S, TimeUnit.SECONDS);
                    answer.put("controller", controller == null ? -1 : controller.id());
                    ArrayNode nodes = answer.putArray("nodes");
                    for (Node n : d.nodes().get(CALL_TIMEOUT_S, TimeUnit.SECONDS)) {
                        nodes.addObject().put("id", n.id()).put("host", n.host()).put("port", n.port());
                    }
                    break;
                }
                case "list_groups": {
                    ArrayNode groups = answer.putArray("groups");
                    for (GroupListing g : admin.listGroups().all().get(CALL_TIMEOUT_S, TimeUnit.SECONDS)) {
                        groups.add(g.groupId());
                    }
                    break;
                }
                case "describe_group": {
                    String group = r.path("group").asText();
                    ConsumerGroupDescription d = admin.describeConsumerGroups(List.of(group)).all()
                            .get(CALL_TIMEOUT_S, TimeUnit.SECONDS).get(group);
                    answer.put("state", d.groupState().toString()).put("members", d.members().size());
                    ArrayNode owned = answer.putArray("assigned");
                    for (MemberDescription m : d.members()) {
                        m.assignment().topicPartitions().forEach(tp -> owned.add(tp.toString()));
                    }
                    ObjectNode committed = answer.putObject("committed");
                    Map<TopicPartition, OffsetAndMetadata> offsets = admin.listConsumerGroupOffsets(group)
                            .partitionsToOffsetAndMetadata().get(CALL_TIMEOUT_S, TimeUnit.SECONDS);
                    offsets.forEach((tp, om) -> committed.put(tp.toString(), om == null ? -1 : om.offset()));
                    break;
                }
                case "list_offsets": {
                    Map<TopicPartition, OffsetSpec> earliest = new HashMap<>();
                    Map<TopicPartition, OffsetSpec> latest = new HashMap<>();
                    int partitions = r.path("partitions").asInt(1);
                    for (int i = 0; i < partitions; i++) {
                        earliest.put(new TopicPartition(topic, i), OffsetSpec.earliest());
                        latest.put(new TopicPartition(topic, i), OffsetSpec.latest());
                    }
                    ObjectNode lo = answer.putObject("earliest");
                    ObjectNode hi = answer.putObject("latest");
                    for (Map.Entry<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> e : admin
                            .listOffsets(earliest).all().get(CALL_TIMEOUT_S, TimeUnit.SECONDS).entrySet()) {
                        lo.put(String.valueOf(e.getKey().partition()), e.getValue().offset());
                    }
                    for (Map.Entry<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> e : admin
                            .listOffsets(latest).all().get(CALL_TIMEOUT_S, TimeUnit.SECONDS).entrySet()) {
                        hi.put(String.valueOf(e.getKey().partition()), e.getValue().offset());
                    }
                    break;
                }
                default:
                    throw new IllegalArgumentException("unknown admin action " + action);
            }
        }
        return answer.put("ok", true);
    }
}
