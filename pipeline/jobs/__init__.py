"""Jobs that run on the "raftbroker" data source: `raftbroker pipeline run JOB ...`.

- `audit`: the Spark-side proof that a topic holds every record exactly once.
- `settlement_totals`: running per-merchant totals of settlement events, to parquet and back
  to a topic; `raftbroker pipeline generate` produces such events (`settlements.py`).
"""
