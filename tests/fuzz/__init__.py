"""A structure-aware fuzzer of both client listeners: requests generated from the protocols'
own schemas (Kafka's through kio, ours through the wire protocol's field rules), valid ones
first and then mutated, sent to live nodes and checked (`tests/fuzz/live.py`)."""
