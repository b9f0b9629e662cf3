"""The store's errors: what a caller of `PartitionStore` may catch, each with its Kafka code.

Role: every failure the store reports on purpose is a `StorageError` (a `RaftbrokerError`), so
the frontend answers it as Kafka would and the replica knows a store it must not go on with.
"""

from __future__ import annotations

from typing import ClassVar

from cluster.errors import RaftbrokerError
from statemachine.errors import ErrorCode


class StorageError(RaftbrokerError):
    """The store cannot do what was asked; the caller must not go on as if it had.

    KAFKA_STORAGE_ERROR, as Kafka answers for a log it cannot use (a closed store, a log that
    diverged or has a gap): retriable, since another replica, or this one once restored, can
    serve the request.
    """

    ERROR: ClassVar[ErrorCode] = ErrorCode.KAFKA_STORAGE_ERROR

    def __init__(self, message: str) -> None:
        super().__init__(self.ERROR, message)


class StorageGapError(StorageError):
    """An append past `next_offset`: the records in between are missing and must be re-fetched
    (KAFKA_STORAGE_ERROR)."""


class StorageCorruptionError(StorageError):
    """Damage on disk that no torn write explains: safer refused than served or dropped.

    CORRUPT_MESSAGE, as Kafka answers for stored records that fail their checks (retriable: a
    healthy replica can serve them).
    """

    ERROR: ClassVar[ErrorCode] = ErrorCode.CORRUPT_MESSAGE
