"""The client's error types: a broker's error answer, or a client-side failure with a Kafka code.

Rules: both are `RaftbrokerError`s (cluster/errors.py), so `.error`, `.message`, `.retriable`
and `.leader` mean what they mean everywhere; `str()` is `CODE: message` (or `CODE` alone).
"""

from __future__ import annotations

from cluster.errors import RaftbrokerError
from statemachine.errors import ErrorCode


class ClientError(RaftbrokerError):
    """An error answer from a broker (`answered`), or a client-side failure with a Kafka code
    (a refused or broken connection, a request that timed out: the broker did not answer);
    `address` is the broker that answered or failed to, where known."""

    def __init__(
        self,
        error: ErrorCode,
        message: str = "",
        leader: str = "",
        *,
        address: str = "",
        answered: bool = False,
    ) -> None:
        super().__init__(error, message, leader=leader)
        self.address = address
        self.answered = answered

    @property
    def unanswered(self) -> bool:
        """A broker at a known address did not answer: ask another (and forget it as a leader)."""
        return bool(self.address) and not self.answered


class ProducerFencedError(ClientError):
    """Another instance with the same transactional id took over: this producer is done
    (INVALID_PRODUCER_EPOCH, or PRODUCER_FENCED from a Kafka listener)."""
