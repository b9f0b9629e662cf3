"""The client's error types: a broker's error answer, or a client-side failure with a Kafka code."""

from __future__ import annotations

from statemachine.errors import ErrorCode


class ClientError(Exception):
    """An error answer from a broker (or a client-side failure with a Kafka code)."""

    def __init__(self, error: ErrorCode, message: str = "", leader: str = "") -> None:
        super().__init__(f"{error.name}: {message}" if message else error.name)
        self.error = error
        self.leader = leader

    @property
    def retriable(self) -> bool:
        return self.error.retriable


class ProducerFencedError(ClientError):
    """Another instance with the same transactional id took over: this producer is done."""
