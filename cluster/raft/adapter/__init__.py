"""pysyncobj, adapted: the only package of the repository that imports it.

Role: everything that subclasses pysyncobj or reaches into it. `PatchedSyncObj` is one
replica of one group: a `SyncObj` ticked by the driver (`autoTick=False`), talking through the
process's `Mesh` (`MeshTransport`), applying `bytes` to a `ReplicatedMachine`, with the
steady state of a write taken off pysyncobj's general walks and its next-index rewind fixed.
`sync_conf` is its configuration, `SnapshotFile` its serializer hooks, `APPLIED`/`failure`
its verdicts as our error codes. The driver (driver.py) and the group (group.py) use only what
this package exports and pysyncobj's public properties (`raftCommitIndex`, `doTick`, ...).

Hardening of pysyncobj 0.3.17 (pinned in pyproject.toml; docs/design.md, "pysyncobj
overrides"):
- its leader sets a follower's next index to the index in each successful reply, so under
  pipelining an old reply rewinds it; `appends.take_reply` keeps the larger of the old and
  new index, and drops a reply of another term (stock's replies carry none);
- its follower deletes every entry after an append's previous one, even entries the append
  repeats, and commits up to its own log's end: `appends.take_append` keeps the paper's rules
  (cut only at a conflict, commit up to the append's last entry);
- peer traffic goes through our own transport, `cluster/raft/mesh/` (one authenticated,
  encrypted connection per node pair for every group, msgpack frames), not pysyncobj's (a
  connection and port per group, bound to 0.0.0.0, every message pickled, zlib-compressed
  and Fernet-wrapped); large entries travel whole, never as pysyncobj's pickled chunks;
- a command goes into the log as it is, behind a two-byte prefix, and only such entries (and
  pysyncobj's own no-ops) are applied: nothing in a journal is ever unpickled;
- journal together with a full dump file, a regular compaction bound, a short leader
  fallback, batching off for latency;
- snapshots go through our own serializer: the machine's canonical bytes plus pysyncobj's two
  boundary entries, encoded with msgpack, never a pickle of the machine.

Modules: overrides.py (the table), transport.py (the mesh under pysyncobj, what a peer may
send), journal_bridge.py (pysyncobj's journal over ours), snapshots.py (the dump hooks),
appends.py (the append exchange) and replica.py (`PatchedSyncObj`, `sync_conf`), each
importing only those before it.

Rules: every name of pysyncobj's this package replaces, or touches beyond its documented API,
has a row in `OVERRIDES` (overrides.py: what we do, why, and what stock pysyncobj does there);
tests/unit/test_pysyncobj_internals.py checks that each still exists in the installed
pysyncobj and that no private name is used in any module here without a row. Upgrading
pysyncobj means reading every row against the new release.
"""

from __future__ import annotations

from cluster.raft.adapter.overrides import OVERRIDES, Override
from cluster.raft.adapter.replica import APPLIED, PatchedSyncObj, failure, sync_conf
from cluster.raft.adapter.snapshots import SnapshotFile, damaged_dump, parse_dump
from cluster.raft.adapter.transport import Heard, log_failure

__all__ = [
    "APPLIED",
    "OVERRIDES",
    "Heard",
    "Override",
    "PatchedSyncObj",
    "SnapshotFile",
    "damaged_dump",
    "failure",
    "log_failure",
    "parse_dump",
    "sync_conf",
]
