"""`fetch_committed`: a group's commits asked for in requests a node takes, and merged.

A node refuses an OffsetFetch naming more than `partitions_per_request_max` partitions, so a
member of a group with more (or an administrator describing one) asks in runs of that many;
naming none asks for every partition the group has, in one request, as Kafka's OffsetFetch.
"""

from __future__ import annotations

import asyncio

from cluster import native as p
from cluster.client.group_consumer import PARTITIONS_PER_REQUEST_MAX, fetch_committed


def answer(request: p.OffsetFetch) -> p.OffsetFetchResponse:
    """Even partitions committed at 10 x their number; odd ones never (offset -1)."""
    named = request.partitions or (p.GroupPartition("all", 0),)
    offsets = tuple(
        p.GroupOffset(g.topic, g.partition, g.partition * 10 if g.partition % 2 == 0 else -1, "")
        for g in named
    )
    return p.OffsetFetchResponse(0, offsets)


class Coordinator:
    """Answers as `answer` does, keeping every request it was sent."""

    def __init__(self) -> None:
        self.asked: list[p.OffsetFetch] = []

    async def __call__(self, request: p.Request) -> p.Response:
        assert isinstance(request, p.OffsetFetch)
        self.asked.append(request)
        return answer(request)


def test_many_partitions_go_in_runs_a_node_takes_and_come_back_merged() -> None:
    call = Coordinator()
    wanted = [("t", i) for i in range(2 * PARTITIONS_PER_REQUEST_MAX + 5)]
    found = asyncio.run(fetch_committed(call, "g", wanted))
    assert [len(r.partitions) for r in call.asked] == [
        PARTITIONS_PER_REQUEST_MAX,
        PARTITIONS_PER_REQUEST_MAX,
        5,
    ]
    assert found == {("t", i): i * 10 for i in range(0, len(wanted), 2)}  # no commit: left out


def test_naming_no_partition_asks_for_all_in_one_request() -> None:
    call = Coordinator()
    assert asyncio.run(fetch_committed(call, "g", ())) == {("all", 0): 0}
    assert [r.partitions for r in call.asked] == [()]
