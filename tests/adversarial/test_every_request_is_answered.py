"""Issue 19, defect 2: every request is answered, whatever it lists, even nothing.

A Produce with no entries was never answered: its answer was written once every entry's result
was in, and there were none. The requests pipelined behind it on its connection then waited
for ever too (answers leave in request order), and the idle check skipped the connection
because answers were pending. Each request kind that lists partitions is sent here with an
empty list, followed on the same connection by a ClusterStatus: both must be answered.
(Metadata with no topics asks for every topic: it is answered like any other.)
"""

from __future__ import annotations

import pytest

from cluster import native as p
from cluster.config import Limits
from tests.adversarial.conftest import KNOWN_TOPIC, Known, assert_intact, exchange

pytestmark = pytest.mark.asyncio(loop_scope="function")

BUDGET_BYTES = Limits().fetch_bytes_max

EMPTY_REQUESTS: list[tuple[p.Request, p.Response]] = [
    (p.Produce(1_000, ()), p.ProduceResponse(())),
    (p.Fetch(0, BUDGET_BYTES, (), False), p.FetchResponse(())),
    (p.Fetch(500, BUDGET_BYTES, (), False), p.FetchResponse(())),
    (p.ListOffsets(()), p.ListOffsetsResponse(())),
    (p.DescribeProducers(KNOWN_TOPIC, ()), p.DescribeProducersResponse(())),
]


@pytest.mark.parametrize(
    ("request_", "expected"),
    EMPTY_REQUESTS,
    ids=["produce", "fetch", "long-poll fetch", "list offsets", "describe producers"],
)
async def test_an_empty_request_is_answered_and_so_is_the_next(
    known: Known, request_: p.Request, expected: p.Response
) -> None:
    address = known.cluster.nodes[0].client_address
    empty, following = await exchange(address, [request_, p.ClusterStatus()])
    assert empty == expected
    assert isinstance(following, p.ClusterStatusResponse)
    await assert_intact(known)
