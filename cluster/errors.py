"""The one error type of client and broker: a Kafka error code, whether to retry, a leader hint.

Role: every failure that crosses a module boundary with an error code is a `RaftbrokerError`
or one of its subclasses, which say where it arose (a refused request, a failed proposal, a
broken frame, a store that cannot go on, a peer link, a client call). Code that only needs the
code, the retry decision and the hint catches the base; code that must tell them apart catches
a subclass.

Rules: rejections of *entries* are not exceptions (a committed no-op returns an `ErrorCode`,
see statemachine/errors.py); this type is for requests and calls that did not produce a
result. A broken invariant is an `assert`, never one of these. Retriability is the code's
(Kafka's `RetriableException` set), so a client and a broker never disagree about it.
"""

from __future__ import annotations

from statemachine.errors import ErrorCode

# An error message on either wire is cut to this many characters; a name a client sent is
# quoted in one by at most QUOTED_CHARS_MAX of them (`quoted`), so a message always fits the
# field it goes into, whatever the client sent (Kafka's legacy strings hold 32,767 bytes).
ERROR_MESSAGE_CHARS_MAX = 512
QUOTED_CHARS_MAX = 64


def quoted(text: str) -> str:
    """`text` as an error message quotes client input: repr'd, and cut short when long."""
    if len(text) <= QUOTED_CHARS_MAX:
        return repr(text)
    return f"{text[:QUOTED_CHARS_MAX]!r}... ({len(text)} characters)"


class RaftbrokerError(Exception):
    """A failure with a Kafka error code; `leader` names the leader to try where one is known."""

    def __init__(self, error: ErrorCode, message: str = "", *, leader: str = "") -> None:
        super().__init__(f"{error.name}: {message}" if message else error.name)
        self.error = error
        self.message = message or error.name
        self.leader = leader

    @property
    def retriable(self) -> bool:
        """True where a Kafka client would retry the same request unchanged."""
        return self.error.retriable


class ProtocolError(RaftbrokerError):
    """Bytes that are not a frame, request or response of this protocol version (of either
    listener: cluster/native/ raises it, cluster/kafka/ a subclass).

    `correlation_id` is the request's, when it could be read: the answer goes to that request.
    """

    def __init__(self, error: ErrorCode, message: str, correlation_id: int | None = None) -> None:
        super().__init__(error, message)
        self.correlation_id = correlation_id


class RequestRefusedError(RaftbrokerError):
    """A whole request the broker refuses: answered with its code, message and leader hint."""
