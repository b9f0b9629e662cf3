"""PeerHosts: which source addresses are each peer's; literal IPs at once, names resolved."""

from __future__ import annotations

import pytest

from cluster.config import Peer
from cluster.peer_hosts import PeerHosts, normal_ip, resolve_host


def peer(node_id: int, host: str) -> Peer:
    return Peer(node_id=node_id, host=host, client_port=9092, raft_port=19_000 + node_id)


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("127.0.0.2", "127.0.0.2"),
        ("::ffff:10.0.0.2", "10.0.0.2"),
        ("0:0:0:0:0:0:0:1", "::1"),
        ("fe80::1%eth0", "fe80::1"),
        ("node1", None),
        ("", None),
    ],
)
def test_normal_ip(text: str, normal: str | None) -> None:
    assert normal_ip(text) == normal


def test_literal_hosts_are_known_without_resolving() -> None:
    hosts = PeerHosts([peer(2, "127.0.0.3"), peer(3, "::1")], refresh_s=5.0)
    assert hosts.ips_of("127.0.0.3:19002") == {"127.0.0.3"}
    assert hosts.ips_of("[::1]:19003") == {"::1"}
    assert hosts.is_peer_ip("::ffff:127.0.0.3")
    assert not hosts.is_peer_ip("127.0.0.9")
    assert not hosts.is_peer_ip("not an ip")
    assert hosts.unresolved == []


@pytest.mark.asyncio(loop_scope="function")
async def test_host_names_resolve_and_a_failure_keeps_what_was_known() -> None:
    # A table stands in for DNS: tests send nothing off loopback.
    table = {"node2": frozenset({"10.1.0.2"})}

    async def resolve(host: str) -> frozenset[str]:
        return table.get(host, frozenset())

    hosts = PeerHosts([peer(2, "node2"), peer(3, "node3")], refresh_s=5.0, resolve=resolve)
    assert hosts.ips_of("node2:19002") == frozenset()
    assert sorted(hosts.unresolved) == ["node2", "node3"]
    await hosts.refresh()
    assert hosts.ips_of("node2:19002") == {"10.1.0.2"}
    assert hosts.is_peer_ip("10.1.0.2")
    assert hosts.unresolved == ["node3"]
    table = {"node3": frozenset({"10.1.0.3"})}  # node2 stops resolving: it keeps its address
    await hosts.refresh()
    assert hosts.ips_of("node2:19002") == {"10.1.0.2"}
    assert hosts.ips_of("node3:19003") == {"10.1.0.3"}


@pytest.mark.asyncio(loop_scope="function")
async def test_localhost_resolves_from_the_hosts_file() -> None:
    assert "127.0.0.1" in await resolve_host("localhost")
