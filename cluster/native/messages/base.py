"""What every native message is: a `Response`, a `Request` (its `Op` and its response class),
`Op` (the request kinds, numbered as Kafka's API keys where Kafka has the request), and an
error answer (`ErrorInfo`, `ErrorResponse`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar

from cluster.native.schema import TEXT_RULE, Struct, address_field, field_of
from statemachine.errors import ErrorCode


class Response(Struct):
    """The successful answer to one Request type."""

    __slots__ = ()


class Op(IntEnum):
    """Request kinds, numbered as Kafka's API keys where Kafka has the request."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUP = 15
    LIST_GROUPS = 16
    CREATE_TOPIC = 19
    DELETE_TOPIC = 20
    INIT_PRODUCER_ID = 22
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27  # an operator's abort only
    TXN_OFFSET_COMMIT = 28
    DELETE_GROUP = 42
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    CLUSTER_STATUS = 1_000  # raftbroker's own: Raft group health
    FENCED_PRODUCE = 1_001  # raftbroker's own: a streaming sink's part, appended once
    PARTITION_TXN_ENTRY = 1_002  # raftbroker's own: a coordinator's entry for a peer's partition


class Request(Struct):
    """Base of every request; subclasses set OP (unique) and RESPONSE."""

    __slots__ = ()
    OP: ClassVar[Op]
    RESPONSE: ClassVar[type[Response]]


@dataclass(frozen=True, slots=True)
class ErrorInfo(Struct):
    """The payload of an error answer; `leader` is "host:port" for NOT_LEADER_OR_FOLLOWER."""

    message: str = field_of(TEXT_RULE)
    leader: str = address_field()


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """A whole request refused: the error code of the response header and its ErrorInfo."""

    error: ErrorCode
    info: ErrorInfo

    def __post_init__(self) -> None:
        if self.error == ErrorCode.NONE:
            raise ValueError("an ErrorResponse needs an error code other than NONE")
