"""The pure, deterministic core of raftbroker: what every replica of a Raft group applies.

Rules for everything in this package (a test enforces them): no I/O, no clock, no randomness, no
threads, no logging. Apply is deterministic: the same entries give byte-identical snapshots on
every replica. Time arrives only inside entries, stamped by the leader.
"""
