"""The Kafka listener: every node answers Kafka's own clients (librdkafka, kafka-python,
aiokafka, kcat) beside the native protocol, over the same `Server` and the same node."""
