"""The data pipeline on Spark: a PySpark data source named "raftbroker", and its helpers.

Role: lets PySpark jobs read topics (batch and streaming) and write them (batch) through the
async client in `cluster.client`, with the options and the row schema of Spark's own Kafka
connector, plus `producerId`, `producerEpoch` and `sequence` so a job can prove exactly-once.

Rules:
- Imports go one way: pipeline -> cluster.client (and cluster.client.sync); nothing in cluster/
  imports pipeline.
- Importing this package does not import PySpark: `pipeline.options` and `pipeline.offsets` are
  pure and usable (and testable) without the optional `spark` extra.
- Use `pipeline.session.register(spark)` to make `spark.read.format("raftbroker")` work.
"""

FORMAT = "raftbroker"
