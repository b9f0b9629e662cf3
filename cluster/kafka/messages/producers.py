"""Producer ids and transactions: InitProducerId (22), AddPartitionsToTxn (24),
AddOffsetsToTxn (25), EndTxn (26), WriteTxnMarkers (27, an operator's abort),
DescribeProducers (61), DescribeTransactions (65) and ListTransactions (66).

Part of the Kafka messages (cluster/kafka/messages/__init__.py has their rules): each request
class names its API, the versions served, its response and how it is refused whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster.kafka.messages.base import Api, Request, Response, VersionRange

# -- InitProducerId (22) -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InitProducerIdResponse(Response):
    error_code: int
    producer_id: int = -1
    producer_epoch: int = -1
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class InitProducerIdRequest(Request):
    API = Api.INIT_PRODUCER_ID
    VERSIONS = VersionRange(0, 5)
    RESPONSE = InitProducerIdResponse

    transactional_id: str | None = None
    transaction_timeout: int = 0
    producer_id: int = -1  # v3+: the producer's current id and epoch (KIP-360), or -1
    producer_epoch: int = -1

    def refusal(self, code: int, message: str) -> InitProducerIdResponse:  # noqa: ARG002
        return InitProducerIdResponse(code)


# -- AddPartitionsToTxn (24), AddOffsetsToTxn (25), EndTxn (26) ----------------------------------


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxnTopic:
    name: str
    partitions: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxnPartitionResult:
    partition_index: int
    partition_error_code: int


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxnTopicResult:
    name: str
    results_by_partition: tuple[AddPartitionsToTxnPartitionResult, ...]


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxnResponse(Response):
    results_by_topic_v3_and_below: tuple[AddPartitionsToTxnTopicResult, ...]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class AddOffsetsToTxnResponse(Response):
    error_code: int
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxnRequest(Request):
    # v0-v3 are a client's (v4+ batch transactions: a broker's, not served).
    API = Api.ADD_PARTITIONS_TO_TXN
    VERSIONS = VersionRange(0, 3)
    RESPONSE = AddPartitionsToTxnResponse

    # v0-v3, a client's (v4+ batch transactions: a broker's). Kafka's own field names.
    v3_and_below_transactional_id: str
    v3_and_below_producer_id: int
    v3_and_below_producer_epoch: int
    v3_and_below_topics: tuple[AddPartitionsToTxnTopic, ...]

    def refusal(self, code: int, message: str) -> AddPartitionsToTxnResponse:  # noqa: ARG002
        return AddPartitionsToTxnResponse(
            tuple(
                AddPartitionsToTxnTopicResult(
                    t.name, tuple(AddPartitionsToTxnPartitionResult(i, code) for i in t.partitions)
                )
                for t in self.v3_and_below_topics
            )
        )


@dataclass(frozen=True, slots=True)
class AddOffsetsToTxnRequest(Request):
    # v0-v4 (v4 adds TRANSACTION_ABORTABLE, which this coordinator never answers).
    API = Api.ADD_OFFSETS_TO_TXN
    VERSIONS = VersionRange(0, 4)
    RESPONSE = AddOffsetsToTxnResponse

    transactional_id: str
    producer_id: int
    producer_epoch: int
    group_id: str

    def refusal(self, code: int, message: str) -> AddOffsetsToTxnResponse:  # noqa: ARG002
        return AddOffsetsToTxnResponse(code)


@dataclass(frozen=True, slots=True)
class EndTxnResponse(Response):
    error_code: int
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class EndTxnRequest(Request):
    # v0-v3 (v4 adds a broker-side error; v5, KIP-890's epoch per transaction: not served).
    API = Api.END_TXN
    VERSIONS = VersionRange(0, 3)
    RESPONSE = EndTxnResponse

    transactional_id: str
    producer_id: int
    producer_epoch: int
    committed: bool

    def refusal(self, code: int, message: str) -> EndTxnResponse:  # noqa: ARG002
        return EndTxnResponse(code)


# -- WriteTxnMarkers (27): an operator's abort of a hanging transaction ---------------------------


@dataclass(frozen=True, slots=True)
class WritableTxnMarkerTopic:
    name: str
    partition_indexes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class WritableTxnMarker:
    producer_id: int
    producer_epoch: int
    transaction_result: bool  # True: commit
    topics: tuple[WritableTxnMarkerTopic, ...]
    coordinator_epoch: int
    transaction_version: int = 0  # v2+ (KIP-890's TV2): ignored, the marker is the same


@dataclass(frozen=True, slots=True)
class WritableTxnMarkerPartitionResult:
    partition_index: int
    error_code: int


@dataclass(frozen=True, slots=True)
class WritableTxnMarkerTopicResult:
    name: str
    partitions: tuple[WritableTxnMarkerPartitionResult, ...]


@dataclass(frozen=True, slots=True)
class WritableTxnMarkerResult:
    producer_id: int
    topics: tuple[WritableTxnMarkerTopicResult, ...]


@dataclass(frozen=True, slots=True)
class WriteTxnMarkersResponse(Response):
    markers: tuple[WritableTxnMarkerResult, ...]


@dataclass(frozen=True, slots=True)
class WriteTxnMarkersRequest(Request):
    # v1-v2 (Kafka 4 has no v0): a broker's request to partition leaders, and the Admin
    # client's `abortTransaction` (kafka-transactions.sh abort), which is what is served.
    API = Api.WRITE_TXN_MARKERS
    VERSIONS = VersionRange(1, 2)
    RESPONSE = WriteTxnMarkersResponse

    markers: tuple[WritableTxnMarker, ...]

    def refusal(self, code: int, message: str) -> WriteTxnMarkersResponse:  # noqa: ARG002
        return WriteTxnMarkersResponse(
            tuple(
                WritableTxnMarkerResult(
                    marker.producer_id,
                    tuple(
                        WritableTxnMarkerTopicResult(
                            t.name,
                            tuple(
                                WritableTxnMarkerPartitionResult(p, code)
                                for p in t.partition_indexes
                            ),
                        )
                        for t in marker.topics
                    ),
                )
                for marker in self.markers
            )
        )


# -- DescribeProducers (61) ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicRequest:
    name: str
    partition_indexes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ProducerState:
    producer_id: int
    producer_epoch: int
    last_sequence: int = -1
    last_timestamp: int = -1
    coordinator_epoch: int = -1
    current_txn_start_offset: int = -1


@dataclass(frozen=True, slots=True)
class PartitionResponse:
    partition_index: int
    error_code: int
    error_message: str | None = None
    active_producers: tuple[ProducerState, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicResponse:
    name: str
    partitions: tuple[PartitionResponse, ...]


@dataclass(frozen=True, slots=True)
class DescribeProducersResponse(Response):
    topics: tuple[TopicResponse, ...]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class DescribeProducersRequest(Request):
    API = Api.DESCRIBE_PRODUCERS
    VERSIONS = VersionRange(0, 0)
    RESPONSE = DescribeProducersResponse

    topics: tuple[TopicRequest, ...]

    def refusal(self, code: int, message: str) -> DescribeProducersResponse:
        return DescribeProducersResponse(
            tuple(
                TopicResponse(
                    t.name, tuple(PartitionResponse(i, code, message) for i in t.partition_indexes)
                )
                for t in self.topics
            )
        )


# -- DescribeTransactions (65), ListTransactions (66): KIP-664 ------------------------------------


@dataclass(frozen=True, slots=True)
class TopicData:
    topic: str
    partitions: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class DescribedTransaction:
    error_code: int
    transactional_id: str
    transaction_state: str = ""
    transaction_timeout: int = 0
    # ms since the epoch: 0 for an id with no transaction yet (Kafka: -1) and in an error's entry
    transaction_start_time: int = 0
    producer_id: int = -1
    producer_epoch: int = -1
    topics: tuple[TopicData, ...] = ()


@dataclass(frozen=True, slots=True)
class DescribeTransactionsResponse(Response):
    transaction_states: tuple[DescribedTransaction, ...]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class DescribeTransactionsRequest(Request):
    API = Api.DESCRIBE_TRANSACTIONS
    VERSIONS = VersionRange(0, 0)
    RESPONSE = DescribeTransactionsResponse

    transactional_ids: tuple[str, ...] = ()

    def refusal(self, code: int, message: str) -> DescribeTransactionsResponse:  # noqa: ARG002
        return DescribeTransactionsResponse(
            tuple(DescribedTransaction(code, t) for t in self.transactional_ids)
        )


@dataclass(frozen=True, slots=True)
class ListedTransaction:
    transactional_id: str
    producer_id: int
    transaction_state: str


@dataclass(frozen=True, slots=True)
class ListTransactionsResponse(Response):
    error_code: int
    unknown_state_filters: tuple[str, ...] = ()
    transaction_states: tuple[ListedTransaction, ...] = ()
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class ListTransactionsRequest(Request):
    # v1 adds the duration filter (KIP-994); v2's id pattern is not served.
    API = Api.LIST_TRANSACTIONS
    VERSIONS = VersionRange(0, 1)
    RESPONSE = ListTransactionsResponse

    state_filters: tuple[str, ...] = ()
    producer_id_filters: tuple[int, ...] = ()
    duration_filter: int = -1

    def refusal(self, code: int, message: str) -> ListTransactionsResponse:  # noqa: ARG002
        return ListTransactionsResponse(code)
