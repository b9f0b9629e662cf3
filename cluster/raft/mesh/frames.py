"""A mesh message on the wire: the frame around it and the payload it carries.

Role: the one place that says what a link's bytes are. Frames are `u32 length | payload`. Once
a link is open a payload is the msgpack (statemachine/codec.py) of `(group route, message)`,
the message being pysyncobj's dict, sealed by the link's cipher when there is a cluster secret;
before it opens a payload is a handshake frame (cluster/raft/handshake.py). A ping is
`("", None)`, sent on a link idle for a heartbeat.

Rules: a payload that does not decode, or is not `(group, message)`, is the peer's fault: a
`LinkError`, and the link is dropped. What the message is for its group is the group's to
judge (the mesh only drops what is not a dict).
"""

from __future__ import annotations

import struct
from typing import Any

from cluster.raft.handshake import LinkError
from statemachine.codec import CodecError, pack, unpack

LENGTH = struct.Struct(">I")  # the frame's header: its payload's length


def payload(group: str, message: dict[str, Any]) -> bytes:
    """A message for `group` as a link carries it, before the link seals it."""
    return pack((group, message))


PING = pack(("", None))  # what an idle link sends, so that its peer hears it is alive


def parse(plain: bytes, size_max: int) -> tuple[str, object] | None:
    """The `(group, message)` an opened payload carries, or None for a ping."""
    try:
        fields = unpack(plain, size_max=size_max)
    except CodecError as exc:
        raise LinkError(f"malformed frame: {exc}") from None
    if not (isinstance(fields, tuple) and len(fields) == 2 and isinstance(fields[0], str)):
        raise LinkError("a frame that is not (group, message)")
    group, message = fields
    if group == "" and message is None:
        return None
    return group, message
