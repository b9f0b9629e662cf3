"""`host:port` text: the one parser for every address a user, a config file or a peer gives.

Rules: a port is 1-65535; an IPv6 host is written in brackets (`[::1]:9092`) and returned
without them; anything else is a `ValueError` whose message quotes the text, for the caller to
put in front of (config key, option name, flag).
"""

from __future__ import annotations

PORT_MAX = 65_535


def parse_address(text: str) -> tuple[str, int]:
    """`(host, port)` of `host:port`; ValueError naming the text when it is not one."""
    host, sep, port = text.strip().rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]
    if (
        not sep
        or not host
        or any(c.isspace() or c in "[]" for c in host)
        or (":" in host and not bracketed)  # an IPv6 host, or a second port: ambiguous
        or not (port.isascii() and port.isdigit())
        or not 1 <= int(port) <= PORT_MAX
    ):
        raise ValueError(f"'{text}' is not host:port (a port is 1-{PORT_MAX})")
    return host, int(port)


def join_address(host: str, port: int) -> str:
    """The text `parse_address` reads back: brackets around an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
