"""The Raft layer: replicated groups of `bytes` commands, each applied to a machine, in log order.

A `RaftGroup` replicates commands and applies them to its `ReplicatedMachine`; `propose()`
returns the apply result, or raises `ProposalError` (retriable, with a leader hint). One
`RaftDriver` per process ticks every group on the event loop that serves clients, and carries
every group's messages over one authenticated, encrypted link per node pair (the mesh).
docs/design.md, "The Raft layer", "pysyncobj overrides" and "The mesh", tells the whole story.

Modules, by role (each imports only those above it):
- handshake.py  the mesh's handshake as a pure state machine: hellos, keys, sealed proofs
- mesh/         the peer links: sockets, frames, routing to groups (`Mesh`, `MeshSettings`)
- spec.py       the types other packages name: machine, spec, status, proposal errors
- journal.py    a group's journal files on disk (no pysyncobj)
- adapter/      pysyncobj, adapted: the only package that imports it, with its table of overrides
- group.py      `RaftGroup`: propose, read, health
- driver.py     `RaftDriver`: ticks every group, owns the mesh

Other packages need only the names this package re-exports.
"""

from cluster.raft.driver import RaftDriver
from cluster.raft.group import RaftGroup
from cluster.raft.mesh import MeshSettings
from cluster.raft.spec import (
    GroupSpec,
    GroupStatus,
    ProposalError,
    ProposalQueueFullError,
    ReplicatedMachine,
)

__all__ = [
    "GroupSpec",
    "GroupStatus",
    "MeshSettings",
    "ProposalError",
    "ProposalQueueFullError",
    "RaftDriver",
    "RaftGroup",
    "ReplicatedMachine",
]
