"""The mesh's handshake, as a pure state machine: frames in, frames and the outcome out.

Role: how two nodes that hold the cluster secret open a link, and nothing else: no sockets,
no clock (the link keeps the deadline), no randomness of its own (the link gives the nonce).
`Mesh` feeds each frame a link receives before it opens to that link's `Handshake`, sends the
frames it returns, and drops the link on `LinkError`; tests drive it with bytes alone.

The protocol (one frame each way at a time; frames are at most `FRAME_BYTES_MAX` bytes):
1. The dialer (the smaller address of the pair) sends a hello in clear:
   `(MAGIC, VERSION, its address, the address it dialed, a fresh 16-byte nonce)`.
2. The acceptor checks it (magic, version, a peer of its own that should dial it, the target
   is itself, a nonce) and answers with its own hello.
3. With a cluster secret, each side derives one AES-256-GCM key per direction from
   HKDF(secret, dialer nonce + acceptor nonce); frame nonces are counters, so a frame
   replayed, reordered or sent back the other way fails to open. Without one (loopback only,
   enforced by the config) frames travel in clear.
4. The dialer sends the sealed proof `("auth", its address)`; the acceptor opens and checks
   it, answers with its own, and is open; the dialer is open once it checked that answer.
A peer without the secret never gets past step 4; nothing it sends reaches a Raft group.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from cluster.errors import RaftbrokerError
from statemachine.codec import CodecError, pack, unpack
from statemachine.errors import ErrorCode

MAGIC = "raftbroker-mesh"
VERSION = 1
NONCE_BYTES = 16
FRAME_BYTES_MAX = 1024  # every frame before a link opens: hellos and proofs are far smaller
SHOWN_CHARS_MAX = 80  # of a value a peer sent, quoted in an error (and so in the log)
_PROOF = "auth"


class LinkError(RaftbrokerError):
    """The peer broke the protocol, failed authentication or went silent: drop the link
    (NETWORK_EXCEPTION)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.NETWORK_EXCEPTION, message)


class Cipher:
    """Seals and opens the frames of one direction; the identity without a secret."""

    def __init__(self, key: bytes | None) -> None:
        self._aead = None if key is None else AESGCM(key)
        self._counter = 0

    def _nonce(self) -> bytes:
        self._counter += 1
        return self._counter.to_bytes(12, "big")

    def seal(self, plain: bytes) -> bytes:
        return plain if self._aead is None else self._aead.encrypt(self._nonce(), plain, None)

    def open(self, sealed: bytes) -> bytes:
        if self._aead is None:
            return sealed
        try:
            return self._aead.decrypt(self._nonce(), sealed, None)
        except InvalidTag:
            raise LinkError("a frame failed authentication (wrong cluster secret?)") from None


def derive_keys(secret: str, dialer_nonce: bytes, acceptor_nonce: bytes) -> tuple[bytes, bytes]:
    """(dialer-to-acceptor key, acceptor-to-dialer key), fresh for every connection."""
    okm = HKDF(
        algorithm=hashes.SHA256(),
        length=64,
        salt=dialer_nonce + acceptor_nonce,
        info=f"{MAGIC} v{VERSION}".encode(),
    ).derive(secret.encode())
    return okm[:32], okm[32:]


@dataclass(frozen=True, slots=True)
class Opened:
    """A finished handshake: the peer's address and the ciphers of the link's two directions."""

    peer: str
    sealer: Cipher
    opener: Cipher


@dataclass(frozen=True, slots=True)
class Step:
    """What one received frame led to: frames to send, in order, and the link once open."""

    send: tuple[bytes, ...] = ()
    opened: Opened | None = None


class _Awaiting(Enum):
    HELLO = "the peer's hello"
    PROOF = "the peer's sealed proof"
    NOTHING = "nothing: open"


class Handshake:
    """One side of one link's handshake. `dialed` is the peer this side dialed, None on the
    accepting side (which learns its peer from the hello); `nonce` must be fresh and random."""

    def __init__(
        self,
        self_address: str,
        peers: frozenset[str],
        secret: str | None,
        *,
        dialed: str | None,
        nonce: bytes,
    ) -> None:
        assert len(nonce) == NONCE_BYTES, "a nonce of the protocol's size"
        self._me = self_address
        self._peers = peers
        self._secret = secret
        self._dialer = dialed is not None
        self.peer = dialed
        self._nonce = nonce
        self._awaiting = _Awaiting.HELLO
        self._sealer = Cipher(None)
        self._opener = Cipher(None)

    @property
    def awaiting(self) -> str:
        """What this side waits for (for the link's log when it gives up)."""
        return self._awaiting.value

    @property
    def awaiting_hello(self) -> bool:
        """Whether the peer's hello has yet to come (a failure then is no valid hello)."""
        return self._awaiting is _Awaiting.HELLO

    def hello(self) -> bytes:
        """This side's hello: the dialer's first frame, once connected."""
        return pack((MAGIC, VERSION, self._me, self.peer, self._nonce))

    def receive(self, frame: bytes) -> Step:
        """Take in the peer's next frame; LinkError when it breaks the protocol."""
        if len(frame) > FRAME_BYTES_MAX:
            raise LinkError(f"a handshake frame of {len(frame)} bytes exceeds {FRAME_BYTES_MAX}")
        if self._awaiting is _Awaiting.HELLO:
            return self._on_hello(frame)  # the only frame in clear
        assert self._awaiting is _Awaiting.PROOF, "the link routes frames once it is open"
        return self._on_proof(self._opener.open(frame))

    def _on_hello(self, frame: bytes) -> Step:
        fields = _decode(frame, "hello")
        if not (isinstance(fields, tuple) and len(fields) == 5 and fields[:2] == (MAGIC, VERSION)):
            raise LinkError("not a raftbroker mesh hello of this version")
        _, _, sender, target, nonce = fields
        if not (isinstance(nonce, bytes) and len(nonce) == NONCE_BYTES):
            raise LinkError("a hello without a valid nonce")
        send: tuple[bytes, ...]
        if self._dialer:
            if sender != self.peer or target != self._me:
                raise LinkError(f"dialed {self.peer}, but {shown(sender)} answered")
            self._key(peer_nonce=nonce)
            send = (self._sealer.seal(pack((_PROOF, self._me))),)
        else:
            # A peer of ours, with the smaller address (the one that dials), dialing us.
            known = isinstance(sender, str) and sender in self._peers and sender < self._me
            if not (known and target == self._me):
                raise LinkError(
                    f"a hello from {shown(sender)} for {shown(target)}: not a peer of {self._me}"
                )
            self.peer = sender
            send = (self.hello(),)
            self._key(peer_nonce=nonce)
        self._awaiting = _Awaiting.PROOF
        return Step(send)

    def _key(self, *, peer_nonce: bytes) -> None:
        if self._secret is None:
            return
        dialer_nonce, acceptor_nonce = (
            (self._nonce, peer_nonce) if self._dialer else (peer_nonce, self._nonce)
        )
        to_acceptor, to_dialer = derive_keys(self._secret, dialer_nonce, acceptor_nonce)
        self._sealer = Cipher(to_acceptor if self._dialer else to_dialer)
        self._opener = Cipher(to_dialer if self._dialer else to_acceptor)

    def _on_proof(self, plain: bytes) -> Step:
        if _decode(plain, "proof") != (_PROOF, self.peer):
            raise LinkError("a proof that names another node")
        assert self.peer is not None
        self._awaiting = _Awaiting.NOTHING
        send = () if self._dialer else (self._sealer.seal(pack((_PROOF, self._me))),)
        return Step(send, Opened(self.peer, self._sealer, self._opener))


def shown(value: object) -> str:
    """A value a peer sent, as an error quotes it: its repr, cut to `SHOWN_CHARS_MAX`."""
    return repr(value)[:SHOWN_CHARS_MAX]


def _decode(frame: bytes, what: str) -> object:
    try:
        return unpack(frame, size_max=FRAME_BYTES_MAX)
    except CodecError as exc:
        raise LinkError(f"malformed {what}: {exc}") from None
