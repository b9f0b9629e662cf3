"""Before a link opens: who may connect, how many may wait, and whose identity a link may claim.

Role: the Raft port is open to the network, so what a connection may cost before it
authenticates is bounded here, and each refusal has a kind the log counts apart. The mesh
(mesh.py) asks `Admission` at accept, before a byte is read, and again once a hello names the
peer; it closes, logs and counts what is refused.

Rules:
- Accepted links not yet open are capped, `handshakes_max` in all and
  `handshakes_per_address_max` from one source IP: past either, a connection is closed with a
  reset before a byte is read. A peer needs one such link at a time.
- With `sources` (a node's `PeerHosts`), a peer's identity is bound to its address: a
  connection from no peer's address is closed unread, and one whose hello claims to be peer X
  is dropped unless it comes from one of X's addresses, so a holder of the secret cannot pose
  as another node (nor replace that node's open link) from elsewhere. What is left: nodes that
  share an address (several on one host, as on 127.0.0.1) cannot be told apart by it, so a
  process on a peer's host that holds the secret can still claim to be any node of that host;
  and a process on a peer's host can take that address's pre-auth slots, delaying (never
  breaking: open links are not affected) that peer's next link while it keeps them full.
"""

from __future__ import annotations

from cluster.raft.mesh.link import Link
from cluster.raft.mesh.settings import MeshSettings

# The kinds of refusal the log counts apart (cluster/refusals.py): a fixed set, never peer text.
STRANGER = "raft port: refused a connection from no peer's address"
CROWDED = "raft port: refused a connection at raft_handshakes_max"
CROWDED_FROM = "raft port: refused a connection at raft_handshakes_per_address_max"
IMPOSTOR = "raft port: refused a peer's identity claimed from another address"
BAD_HELLO = "raft link: no valid hello"
BAD_PROOF = "raft link: authentication failed"
TIMED_OUT = "raft link: not authenticated in time"


class Admission:
    """The accepted links not yet open, counted in all and by source IP, and who may connect."""

    def __init__(self, settings: MeshSettings) -> None:
        self.settings = settings
        self._unopened: dict[str, int] = {}  # accepted links not yet open, by source IP
        self._unopened_total = 0

    @property
    def unopened(self) -> int:
        """Accepted links not yet open (authenticated)."""
        return self._unopened_total

    def refusal(self, source: str) -> tuple[str, str] | None:
        """Why a connection from `source` is refused at accept: (kind, detail), or None."""
        s = self.settings
        if s.sources is not None and not s.sources.is_peer_ip(source):
            return STRANGER, f"from {source}, closed unread"
        if self._unopened_total >= s.handshakes_max:
            total = self._unopened_total
            return CROWDED, f"from {source}, closed unread: {total} links not yet authenticated"
        from_source = self._unopened.get(source, 0)
        if from_source >= s.handshakes_per_address_max:
            detail = (
                f"from {source}, closed unread: {from_source} of its links not authenticated yet"
            )
            return CROWDED_FROM, detail
        return None

    def take_slot(self, link: Link) -> None:
        """`link`, just accepted, counts among the accepted links not yet open."""
        assert link.source is not None, "only accepted links hold a slot"
        link.holds_slot = True
        self._unopened[link.source] = self._unopened.get(link.source, 0) + 1
        self._unopened_total += 1

    def free_slot(self, link: Link) -> None:
        """`link` no longer counts among the accepted links not yet open (opened, or dropped)."""
        if not link.holds_slot:
            return
        assert link.source is not None, "only accepted links hold a slot"
        link.holds_slot = False
        self._unopened_total -= 1
        left = self._unopened[link.source] - 1
        if left:
            self._unopened[link.source] = left
        else:
            del self._unopened[link.source]

    def impostor(self, peer: str, source: str | None) -> str | None:
        """Why a link from `source` may not be `peer`, or None when it may. A peer's identity
        holds only from its own addresses: a node that knows the secret must not pose as
        another (and replace its link) from elsewhere."""
        sources = self.settings.sources
        if sources is None:
            return None
        assert source is not None, "an accepting link knows its source"
        ips = sources.ips_of(peer)
        if source in ips:
            return None
        expected = ", ".join(sorted(ips)) or "none resolved yet"
        return f"claims to be {peer} but connects from {source} (its addresses: {expected})"


def failure_kind(link: Link) -> str:
    """The kind of a failed handshake, by how far it got: the hello, or the sealed proof."""
    return BAD_HELLO if link.handshake.awaiting_hello else BAD_PROOF
