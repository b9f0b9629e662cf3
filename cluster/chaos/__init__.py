"""Chaos testing of raftbroker: a seeded nemesis, a recording workload and a history checker.

`history` is the event model and its JSONL file; `checker` is a pure function from a history to
a report of anomalies and figures. The rest (`workload`, `nemesis`, `links`, `runner`) drive a
real local cluster and write that history.
"""
