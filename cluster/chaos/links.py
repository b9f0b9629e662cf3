"""Network partitions between local nodes, inside a network namespace the run owns.

Role: cut and heal the links between nodes' addresses (127.0.0.2, .3, ...) while clients on
127.0.0.1 still reach every node. This changes routing, so it is done only inside a network
namespace created for the run (`raftbroker chaos run` re-executes itself in one when the machine
allows it: root, iproute2, namespaces) and never on the machine's own network.

How: the kernel's `local` routing rule is moved behind a slot for our rules, and a cut is a pair
of `blackhole` rules (from A to B, from B to A): packets between the two addresses vanish
silently, established connections stall until a side times out, new ones fail at once. Healing
deletes every rule of that slot. (This machine's kernel lacks tc's classifiers, so rules, not
tc filters.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable

NAMESPACE_ENV = "RAFTBROKER_CHAOS_NETNS"  # set inside the namespace a run created
RULE_PREF = 10
LOCAL_PREF = 100


def netns_unavailable_reason() -> str | None:
    """Why this machine cannot give a run its own network namespace, or None if it can."""
    if os.geteuid() != 0:
        return "not root: network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"rbprobe{os.getpid()}"
    created = _ip("netns", "add", probe)
    if created is not None:
        return f"`ip netns add` failed: {created}"
    _ip("netns", "del", probe)
    return None


def create_namespace(name: str) -> None:
    error = _ip("netns", "add", name)
    if error is not None:
        raise RuntimeError(f"cannot create network namespace {name}: {error}")


def delete_namespace(name: str) -> None:
    _ip("netns", "del", name)


def in_namespace_command(name: str, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", name, *argv]


class LinkCutter:
    """Cuts between node addresses; usable only inside the run's own namespace."""

    def __init__(self) -> None:
        assert os.environ.get(NAMESPACE_ENV), "link cuts outside the run's namespace"
        self._cuts: set[frozenset[str]] = set()

    def prepare(self) -> None:
        """Bring loopback up and make room for our rules before the kernel's local table."""
        _must("link", "set", "lo", "up")
        _must("rule", "add", "pref", str(LOCAL_PREF), "table", "local")
        _ip("rule", "del", "pref", "0")

    def isolate(self, host: str, others: Iterable[str]) -> None:
        for other in others:
            self.cut(host, other)

    def cut(self, a: str, b: str) -> None:
        if frozenset((a, b)) in self._cuts:
            return
        for src, dst in ((a, b), (b, a)):
            _must("rule", "add", "pref", str(RULE_PREF), "from", src, "to", dst, "blackhole")
        self._cuts.add(frozenset((a, b)))

    def heal(self) -> None:
        while _ip("rule", "del", "pref", str(RULE_PREF)) is None:
            pass  # one rule per call, until none is left at that preference
        self._cuts.clear()

    @property
    def cuts(self) -> int:
        return len(self._cuts)


def _ip(*args: str) -> str | None:
    """Run `ip ARGS`; None on success, else its error output."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=False)
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


def _must(*args: str) -> None:
    error = _ip(*args)
    if error is not None:
        raise RuntimeError(f"ip {' '.join(args)}: {error}")
