"""The Kafka listener's tables come from its classes: every request class declares its API,
versions, response and refusal (cluster/kafka/messages/), each handler the request it serves
(cluster/kafka/dispatch.py). A new API is a request class and one handler; a handler missing
or given twice is caught at a node's start, not met by a client."""

from __future__ import annotations

import pytest

from cluster.kafka import codec
from cluster.kafka import messages as m
from cluster.kafka.dispatch import Call, check_every_request_served, handlers_of, serves


def test_the_tables_are_built_from_the_request_classes() -> None:
    assert set(m.REQUESTS) == set(codec.SUPPORTED)
    for api, cls in m.REQUESTS.items():
        assert cls.API is api
        assert codec.SUPPORTED[api] == cls.VERSIONS
        assert m.MESSAGES[api] == (cls, cls.RESPONSE)
        assert issubclass(cls.RESPONSE, m.Response)
        assert "refusal" in vars(cls), f"{cls.__name__} refuses as its base would"


class _Served:
    @serves(m.HeartbeatRequest)
    async def heartbeat(self, _request: m.HeartbeatRequest, _call: Call) -> m.HeartbeatResponse:
        return m.HeartbeatResponse(0)


class _AlsoHeartbeat:
    @serves(m.HeartbeatRequest)
    async def beat(self, _request: m.HeartbeatRequest, _call: Call) -> m.HeartbeatResponse:
        return m.HeartbeatResponse(0)


def test_handlers_are_found_by_their_mark_and_each_request_needs_one() -> None:
    served = _Served()
    table = handlers_of(served)
    assert table == {m.HeartbeatRequest: served.heartbeat}
    with pytest.raises(AssertionError, match=r"no handler of .*MetadataRequest"):
        check_every_request_served(table)
    check_every_request_served(table, elsewhere=set(m.REQUESTS.values()))
    with pytest.raises(AssertionError, match="two handlers of HeartbeatRequest"):
        handlers_of(served, _AlsoHeartbeat())
