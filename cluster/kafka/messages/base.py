"""What every Kafka message class of ours stands on: Kafka's API keys, a request's header,
and the declaration each request class makes of itself.

A request class names its API (`API`), the versions this listener serves (`VERSIONS`, from the
oldest to the newest; every one exists in kio both ways, tests/unit/test_kafka_codec.py), its
response class (`RESPONSE`), and `refusal`: its API's own answer when the request is refused
whole (a deadline, a bug answered UNKNOWN_SERVER_ERROR), the code on every topic, partition,
group or member where that answer carries codes (Kafka has no generic error response). The
tables the codec, the wire and the frontend use are built from these classes
(cluster/kafka/messages/__init__.py), so a new API is one request class (and its response),
and one handler.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar, NamedTuple
from uuid import UUID

NO_TOPIC_ID: UUID | None = None  # a topic named, not identified


class Api(IntEnum):
    """Kafka's API keys, those a client sends (what this listener serves: `REQUESTS`)."""

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
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    OFFSET_DELETE = 47
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    CONSUMER_GROUP_HEARTBEAT = 68


class VersionRange(NamedTuple):
    min_version: int
    max_version: int


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


class Response:
    """The body of a response (every version's fields, by Kafka's names)."""

    __slots__ = ()


class Request:
    """The body of a request: see the module's rules."""

    __slots__ = ()
    API: ClassVar[Api]
    VERSIONS: ClassVar[VersionRange]
    RESPONSE: ClassVar[type[Response]]

    def refusal(self, code: int, message: str) -> Response:
        """This request refused whole with `code` (and `message`, where the answer has one)."""
        raise NotImplementedError
