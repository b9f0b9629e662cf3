"""Which handler answers which Kafka request: declared where the handler is written.

Role: a handler of the Kafka listener is a method marked `@serves(SomeRequest)`, taking the
request's body and the `Call` it came in (version, client, source address); `handlers_of`
gathers the marked methods of the objects that answer requests (the frontend, its topic and
group parts) into the table the frontend dispatches by, so a new API is its request class
(cluster/kafka/messages/) and one handler.

Rules: one handler per request class; `check_every_request_served` holds every request the
listener advertises (`messages.REQUESTS`) to one, at the start of a node, where a missing one
is a bug (an assert), not a request refused later.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from cluster.kafka import messages as m

F = TypeVar("F", bound=Callable[..., Any])
# A marked method, bound: (the request's body, its call) -> the answer.
Handler = Callable[[Any, "Call"], Awaitable[m.Response]]
_MARK = "kafka_serves"


@dataclass(frozen=True, slots=True)
class Call:
    """What a handler knows of a request besides its body."""

    version: int
    client_id: str | None
    source: str  # the client's address (what DescribeGroups shows as a member's host)


def serves(request: type[m.Request]) -> Callable[[F], F]:
    """Mark a method as the handler of `request`."""

    def mark(method: F) -> F:
        setattr(method, _MARK, request)
        return method

    return mark


def handlers_of(*objects: object) -> dict[type[m.Request], Handler]:
    """Every marked method of `objects`, bound, by the request class it serves."""
    table: dict[type[m.Request], Handler] = {}
    for obj in objects:
        for name in dir(type(obj)):
            served = getattr(getattr(type(obj), name, None), _MARK, None)
            if served is None:
                continue
            assert served not in table, f"two handlers of {served.__name__}"
            table[served] = getattr(obj, name)
    return table


def check_every_request_served(
    handlers: dict[type[m.Request], Handler], elsewhere: Iterable[type[m.Request]] = ()
) -> None:
    """Assert that each advertised request has a handler (or is answered `elsewhere`)."""
    missing = set(m.REQUESTS.values()) - set(handlers) - set(elsewhere)
    assert not missing, f"no handler of {sorted(c.__name__ for c in missing)}"
