"""Raft peer links: one authenticated, encrypted TCP connection per node pair, for every group.

pysyncobj's stock transport opens a connection per group and node pair, pickles every message,
zlib-compresses it and wraps it in Fernet (AES-CBC + HMAC + base64): a fifth of a node's CPU under
load, and a port per group. `Mesh` replaces it. Every Raft group of the process sends through it;
a frame names its group, and cluster/raft/adapter/ plugs one thin endpoint per group into
pysyncobj. docs/design.md, "The mesh", tells the whole story; each module's docstring gives the
rules it keeps.

Modules, each importing only those before it (and of cluster/raft/, only handshake.py):
- settings.py   `MeshSettings`, and what the mesh is given: a `Poller`, each group's
                `Endpoint`, the `PeerSources` a peer's identity is bound to
- frames.py     a frame on the wire: `u32 length | payload`, `(group, message)` in msgpack,
                the ping
- link.py       `Link`: one TCP connection, through its handshake and while open: its buffers,
                queued sends, frames cut from its input
- admission.py  before a link opens: the caps on links not yet open, who may connect and
                under whose identity; the kinds of refusal the log counts apart
- mesh.py       `Mesh`: dial, accept, drive handshakes, route messages to groups, held sends,
                pings and timeouts, what went wrong

Other packages need only the names this package re-exports.
"""

from cluster.peer_hosts import PeerSources
from cluster.raft.mesh.admission import (
    BAD_HELLO,
    BAD_PROOF,
    CROWDED,
    CROWDED_FROM,
    IMPOSTOR,
    STRANGER,
    TIMED_OUT,
)
from cluster.raft.mesh.mesh import Mesh
from cluster.raft.mesh.settings import (
    ERROR,
    READ,
    WRITE,
    Endpoint,
    MeshSettings,
    Poller,
)

__all__ = [
    "BAD_HELLO",
    "BAD_PROOF",
    "CROWDED",
    "CROWDED_FROM",
    "ERROR",
    "IMPOSTOR",
    "READ",
    "STRANGER",
    "TIMED_OUT",
    "WRITE",
    "Endpoint",
    "Mesh",
    "MeshSettings",
    "PeerSources",
    "Poller",
]
