"""The mesh's handshake (cluster/raft/handshake.py), driven with bytes alone: no socket, no clock.

Two holders of the cluster secret open a link with one key per direction; anyone else, and
anything else (a wrong secret, another protocol or version, oversize or malformed frames, a
proof replayed from another link or reflected back), is refused with a LinkError before a
link opens.
"""

from __future__ import annotations

import pytest

from cluster.errors import RaftbrokerError
from cluster.raft.handshake import (
    FRAME_BYTES_MAX,
    MAGIC,
    NONCE_BYTES,
    SHOWN_CHARS_MAX,
    VERSION,
    Cipher,
    Handshake,
    LinkError,
    Opened,
    derive_keys,
)
from statemachine.codec import pack
from statemachine.errors import ErrorCode

DIALER, ACCEPTOR = "127.0.0.2:9000", "127.0.0.3:9000"  # the smaller address dials


def dialer(secret: str | None = "s3cret", nonce: bytes = b"d" * NONCE_BYTES) -> Handshake:
    return Handshake(DIALER, frozenset({ACCEPTOR}), secret, dialed=ACCEPTOR, nonce=nonce)


def acceptor(secret: str | None = "s3cret", nonce: bytes = b"a" * NONCE_BYTES) -> Handshake:
    return Handshake(ACCEPTOR, frozenset({DIALER}), secret, dialed=None, nonce=nonce)


def hello(sender: str = DIALER, target: str = ACCEPTOR, **fields: object) -> bytes:
    values = {"magic": MAGIC, "version": VERSION, "nonce": b"n" * NONCE_BYTES, **fields}
    return pack((values["magic"], values["version"], sender, target, values["nonce"]))


class Run:
    """One handshake between `d` and `a`, each frame handed to the other side, the frames kept."""

    def __init__(self, d: Handshake, a: Handshake) -> None:
        self.d, self.a = d, a
        self.d_hello = d.hello()
        (self.a_hello,) = self.expect_no_link(a, self.d_hello)
        (self.d_proof,) = self.expect_no_link(d, self.a_hello)

    @staticmethod
    def expect_no_link(side: Handshake, frame: bytes) -> tuple[bytes, ...]:
        step = side.receive(frame)
        assert step.opened is None
        return step.send

    def finish(self) -> tuple[Opened, Opened]:
        """(the dialer's link, the acceptor's link)."""
        a_step = self.a.receive(self.d_proof)
        (a_proof,) = a_step.send
        d_step = self.d.receive(a_proof)
        assert d_step.send == ()
        assert a_step.opened is not None and d_step.opened is not None
        return d_step.opened, a_step.opened


def test_holders_of_the_secret_open_with_one_key_per_direction() -> None:
    d_link, a_link = Run(dialer(), acceptor()).finish()
    assert (d_link.peer, a_link.peer) == (ACCEPTOR, DIALER)
    to_acceptor = d_link.sealer.seal(b"append")
    assert b"append" not in to_acceptor
    assert a_link.opener.open(to_acceptor) == b"append"
    assert d_link.opener.open(a_link.sealer.seal(b"reply")) == b"reply"
    with pytest.raises(LinkError, match="authentication"):
        d_link.opener.open(d_link.sealer.seal(b"reflected"))  # sent back the way it came


def test_without_a_secret_on_both_sides_frames_travel_in_clear() -> None:
    d_link, a_link = Run(dialer(None), acceptor(None)).finish()
    assert d_link.sealer.seal(b"append") == b"append"
    assert a_link.opener.open(b"append") == b"append"


def test_a_wrong_secret_fails_at_the_dialers_proof() -> None:
    run = Run(dialer("right"), acceptor("wrong"))
    with pytest.raises(LinkError, match="authentication") as refused:
        run.a.receive(run.d_proof)
    assert isinstance(refused.value, RaftbrokerError)
    assert refused.value.error is ErrorCode.NETWORK_EXCEPTION


def test_the_dialer_refuses_an_acceptor_without_the_secret() -> None:
    run = Run(dialer(), acceptor())
    with pytest.raises(LinkError, match="authentication"):
        run.d.receive(pack(("auth", ACCEPTOR)))  # the best it can send: unsealed


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (hello(magic="kafka"), "not a raftbroker mesh hello"),
        (hello(version=VERSION + 1), "not a raftbroker mesh hello"),
        (pack((MAGIC, VERSION, DIALER, ACCEPTOR)), "not a raftbroker mesh hello"),
        (pack([MAGIC, VERSION]), "not a raftbroker mesh hello"),
        (hello(nonce=b"short"), "nonce"),
        (hello(nonce="n" * NONCE_BYTES), "nonce"),
        (b"GET / HTTP/1.1\r\n\r\n", "malformed hello"),
        (b"\xc1", "malformed hello"),
        (b"", "malformed hello"),
    ],
)
def test_a_hello_of_another_protocol_or_version_or_garbage_is_refused(
    frame: bytes, reason: str
) -> None:
    with pytest.raises(LinkError, match=reason):
        acceptor().receive(frame)


def test_a_frame_over_the_handshake_bound_is_refused_before_it_is_read() -> None:
    oversize = hello(nonce=b"n" * (FRAME_BYTES_MAX + 1))
    with pytest.raises(LinkError, match=f"exceeds {FRAME_BYTES_MAX}"):
        acceptor().receive(oversize)
    run = Run(dialer(), acceptor())
    with pytest.raises(LinkError, match="exceeds"):
        run.a.receive(run.d_proof + b"\x00" * FRAME_BYTES_MAX)


@pytest.mark.parametrize(
    ("sender", "target"),
    [
        ("127.0.0.9:9000", ACCEPTOR),  # not a peer
        (DIALER, "127.0.0.9:9000"),  # a peer, but it meant another node
        (["a", "list"], ACCEPTOR),  # not even an address
    ],
)
def test_the_acceptor_refuses_a_hello_from_a_stranger_or_for_another_node(
    sender: object, target: str
) -> None:
    with pytest.raises(LinkError, match="not a peer"):
        acceptor().receive(pack((MAGIC, VERSION, sender, target, b"n" * NONCE_BYTES)))


def test_a_refusal_quotes_what_a_stranger_sent_cut_short() -> None:
    """The message reaches the node's log: a stranger's long text must not."""
    long = "x" * 400  # twice that, and the rest of a hello, under the 1 KiB bound
    with pytest.raises(LinkError, match="not a peer") as refused:
        acceptor().receive(pack((MAGIC, VERSION, long, long, b"n" * NONCE_BYTES)))
    assert len(refused.value.message) < 2 * SHOWN_CHARS_MAX + 100
    side = dialer()
    side.hello()
    with pytest.raises(LinkError, match="answered") as refused:
        side.receive(hello(sender=long, target=DIALER))
    assert len(refused.value.message) < SHOWN_CHARS_MAX + 100


def test_the_acceptor_refuses_a_peer_that_should_not_dial_it() -> None:
    """Of each pair the smaller address dials: a larger one dialing is refused."""
    larger = "127.0.0.9:9000"
    side = Handshake(ACCEPTOR, frozenset({larger}), "s3cret", dialed=None, nonce=b"a" * 16)
    with pytest.raises(LinkError, match="not a peer"):
        side.receive(hello(sender=larger))


def test_the_dialer_refuses_an_answer_from_another_node() -> None:
    side = dialer()
    side.hello()
    with pytest.raises(LinkError, match="answered"):
        side.receive(hello(sender="127.0.0.9:9000", target=DIALER))


def test_a_proof_replayed_from_another_link_fails() -> None:
    """A recorded proof opens only under the nonces of the link it was made for."""
    recorded = Run(dialer(nonce=b"1" * 16), acceptor(nonce=b"2" * 16)).d_proof
    fresh = Run(dialer(nonce=b"3" * 16), acceptor(nonce=b"4" * 16))
    with pytest.raises(LinkError, match="authentication"):
        fresh.a.receive(recorded)


def test_the_dialers_own_proof_reflected_back_to_it_fails() -> None:
    run = Run(dialer(), acceptor())
    with pytest.raises(LinkError, match="authentication"):
        run.d.receive(run.d_proof)


def test_a_proof_must_name_the_peer_of_the_hello() -> None:
    run = Run(dialer(None), acceptor(None))
    with pytest.raises(LinkError, match="names another node"):
        run.a.receive(pack(("auth", "127.0.0.9:9000")))
    with pytest.raises(LinkError, match="malformed proof"):
        Run(dialer(None), acceptor(None)).a.receive(b"\xc1")


def test_sealed_frames_open_only_once_and_in_order() -> None:
    to_acceptor, to_dialer = derive_keys("secret", b"d" * 16, b"a" * 16)
    assert to_acceptor != to_dialer
    sealer, opener = Cipher(to_acceptor), Cipher(to_acceptor)
    first, second = sealer.seal(b"one"), sealer.seal(b"two")
    with pytest.raises(LinkError, match="authentication"):
        opener.open(second)  # reordered
    replay = Cipher(to_acceptor)
    assert replay.open(first) == b"one"
    with pytest.raises(LinkError, match="authentication"):
        replay.open(first)  # replayed
