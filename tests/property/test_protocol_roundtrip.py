"""Properties of the native protocol (cluster.native), with strategies derived from the field
rules alone.

Every request, response and error answer round-trips; random bytes, random headers and
valid bodies with one part replaced, dropped or added decode or raise `ProtocolError`, never
anything else, and the error carries the correlation id whenever the body had a readable one.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster import native as p
from cluster.config import Limits
from statemachine import fields as f
from statemachine.codec import unpack
from statemachine.errors import ErrorCode
from tests.unit.test_protocol import wire_records

T = TypeVar("T")
LIMITS = Limits()
ITEMS_MAX = 3  # items per generated tuple: enough for nesting, small enough to be quick
PROFILE = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])

correlation_ids = st.integers(0, 2**31 - 1)
request_types = st.sampled_from(p.REQUEST_TYPES)
error_codes = st.sampled_from([code for code in ErrorCode if code != ErrorCode.NONE])
garbage: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)


def values(rule: p.Rule) -> st.SearchStrategy[Any]:
    """Every value a field with this rule may hold on the wire."""
    match rule:
        case f.IntRule(lo=lo, hi=hi):
            return st.integers(lo, hi)
        case f.BoolRule():
            return st.booleans()
        case f.StrRule(chars_max=chars_max):
            return st.text(max_size=min(chars_max, 12))
        case f.BytesRule():
            return st.binary(max_size=24)
        case f.ErrorCodeRule():
            return st.sampled_from(ErrorCode)
        case p.StructRule(cls=cls):
            return records(cls)
        case p.TupleRule(item=item, bound=bound):
            return st.lists(values(item), max_size=min(bound(LIMITS), ITEMS_MAX)).map(tuple)


def records(cls: type[p.Struct]) -> st.SearchStrategy[Any]:
    return st.builds(cls, *(values(rule) for _, rule in p.field_rules(cls)))


any_request = st.one_of([records(cls) for cls in p.REQUEST_TYPES])
request_and_response = request_types.flatmap(
    lambda cls: st.tuples(st.just(cls), records(cls.RESPONSE))
)


def body_of(frame: bytes) -> bytes:
    assert p.LENGTH_PREFIX.unpack(frame[:4]) == (len(frame) - 4,)
    return frame[4:]


def mutate(data: st.DataObject, node: Any) -> Any:
    """`node` with one part, anywhere below it, replaced, dropped or joined by garbage."""
    if isinstance(node, list) and node:
        index = data.draw(st.integers(0, len(node) - 1))
        action = data.draw(st.sampled_from(["descend", "drop", "add", "replace"]))
        if action == "descend":
            return [*node[:index], mutate(data, node[index]), *node[index + 1 :]]
        if action == "drop":
            return node[:index] + node[index + 1 :]
        if action == "add":
            return [*node[:index], data.draw(garbage), *node[index:]]
    return data.draw(garbage)


def wire_form(frame: bytes) -> list[Any]:
    raw: list[Any] = msgpack.unpackb(body_of(frame), raw=False)
    return raw


def packed(value: object) -> bytes:
    data: bytes = msgpack.packb(value, use_bin_type=True)
    return data


def attempt(decode: Callable[[], T]) -> T | p.ProtocolError:
    """What `decode` returns, or the ProtocolError it raises (any other exception escapes)."""
    try:
        return decode()
    except p.ProtocolError as exc:
        return exc


@PROFILE
@given(any_request, correlation_ids)
def test_every_request_round_trips(request: p.Request, correlation_id: int) -> None:
    frame = p.encode_request(correlation_id, request)
    assert p.decode_request(body_of(frame), LIMITS) == (correlation_id, request)


@PROFILE
@given(request_and_response, correlation_ids)
def test_every_response_round_trips(
    case: tuple[type[p.Request], p.Response], correlation_id: int
) -> None:
    request_type, response = case
    frame = p.encode_response(correlation_id, response)
    assert p.decode_response(body_of(frame), request_type) == (correlation_id, response)


@PROFILE
@given(request_types, error_codes, records(p.ErrorInfo), correlation_ids)
def test_every_error_answer_round_trips(
    request_type: type[p.Request], error: ErrorCode, info: p.ErrorInfo, correlation_id: int
) -> None:
    frame = p.encode_response(correlation_id, p.ErrorResponse(error, info))
    expected = (correlation_id, p.ErrorResponse(error, info))
    assert p.decode_response(body_of(frame), request_type) == expected


@PROFILE
@given(st.binary(max_size=64), request_types)
def test_random_bytes_decode_or_raise_protocol_errors_only(
    data: bytes, request_type: type[p.Request]
) -> None:
    attempt(lambda: p.decode_request(data, LIMITS))
    attempt(lambda: p.decode_response(data, request_type))
    attempt(lambda: p.peek_correlation_id(data))


@PROFILE
@given(request_and_response, correlation_ids, st.data())
def test_corrupted_bodies_decode_or_raise_protocol_errors_only(
    case: tuple[type[p.Request], p.Response], correlation_id: int, data: st.DataObject
) -> None:
    request_type, response = case
    request = data.draw(records(request_type))
    for body in (
        body_of(p.encode_request(correlation_id, request)),
        body_of(p.encode_response(correlation_id, response)),
    ):
        start = data.draw(st.integers(0, len(body)))
        end = data.draw(st.integers(start, min(len(body), start + 4)))
        corrupted = body[:start] + data.draw(st.binary(max_size=4)) + body[end:]
        attempt(partial(p.decode_request, corrupted, LIMITS))
        attempt(partial(p.decode_response, corrupted, request_type))


@PROFILE
@given(st.data(), any_request, correlation_ids)
def test_mutated_requests_raise_protocol_errors_with_their_correlation_id(
    data: st.DataObject, request: p.Request, correlation_id: int
) -> None:
    version, cid, op, payload = wire_form(p.encode_request(correlation_id, request))
    body = packed([version, cid, op, mutate(data, payload)])
    outcome = attempt(lambda: p.decode_request(body, LIMITS))
    if isinstance(outcome, p.ProtocolError):
        assert outcome.error == ErrorCode.INVALID_REQUEST
        assert outcome.correlation_id == correlation_id
    else:
        assert outcome[0] == correlation_id


@PROFILE
@given(st.data(), request_and_response, correlation_ids)
def test_mutated_responses_raise_protocol_errors_with_their_correlation_id(
    data: st.DataObject, case: tuple[type[p.Request], p.Response], correlation_id: int
) -> None:
    request_type, response = case
    version, cid, error, payload = wire_form(p.encode_response(correlation_id, response))
    body = packed([version, cid, error, mutate(data, payload)])
    outcome = attempt(lambda: p.decode_response(body, request_type))
    if isinstance(outcome, p.ProtocolError):
        assert outcome.error == ErrorCode.INVALID_REQUEST
        assert outcome.correlation_id == correlation_id
    else:
        assert outcome[0] == correlation_id


@PROFILE
@given(st.lists(garbage | correlation_ids, max_size=5), any_request)
def test_random_headers_keep_a_readable_correlation_id(
    header: list[Any], request: p.Request
) -> None:
    payload = wire_form(p.encode_request(0, request))[3]
    body = packed([*header[:3], payload, *header[3:]])
    readable = len(header) >= 2 and type(header[1]) is int and 0 <= header[1] < 2**31
    outcome = attempt(lambda: p.decode_request(body, LIMITS))
    if isinstance(outcome, p.ProtocolError):
        assert outcome.correlation_id == (header[1] if readable else None)


def loaded(load: Callable[[type[p.Struct], object, Limits], object], cls: type, raw: object) -> Any:
    """What `load` makes of `raw`: the record, or the reason and place of its FieldError."""
    try:
        return load(cls, raw, LIMITS)
    except f.FieldError as exc:
        return ("FieldError", exc.reason, exc.path)


every_record = st.sampled_from(wire_records()).flatmap(
    lambda cls: st.tuples(st.just(cls), records(cls))
)


@PROFILE
@given(every_record, st.booleans(), st.data())
def test_each_records_generated_loader_loads_as_its_rules_do_field_by_field(
    case: tuple[type[p.Struct], p.Struct], mutated: bool, data: st.DataObject
) -> None:
    """The loader generated per class (`_loader`) against `_load_fields`, on valid bodies and
    bodies with one part changed: the same record, or the same reason at the same place.
    Every record class is the top level in some example, so equal at one level (nested
    records by the generated loaders in both) is equal all the way down."""
    cls, record = case
    raw = msgpack.unpackb(packed(p.dump_struct(record)), raw=False)
    if mutated:
        raw = mutate(data, raw)
    body = unpack(packed(raw), size_max=1 << 20)  # as the wire gives it: arrays as tuples
    expected = loaded(p.load_fields, cls, body)
    assert loaded(p.load_struct, cls, body) == expected
    if not mutated:
        assert expected == record


def edges(rule: p.Rule) -> list[Any]:
    """Values at and just past a field rule's bounds, and values of every other wire type."""
    others: list[Any] = [None, True, False, 0, -1, 1.5, "", b"", (), (0,)]
    match rule:
        case f.IntRule(lo=lo, hi=hi):
            return [*others, lo - 1, lo, hi, hi + 1]
        case f.StrRule(chars_max=chars_max) if chars_max < f.UNBOUNDED:
            return [*others, "x" * chars_max, "x" * (chars_max + 1), "é" * chars_max]
        case f.ErrorCodeRule():
            return [*others, int(ErrorCode.NONE), max(ErrorCode) + 1]
    return others


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(every_record)
def test_each_records_generated_loader_meets_every_rule_at_its_edges(
    case: tuple[type[p.Struct], p.Struct],
) -> None:
    """Each field of a valid body replaced by each of its rule's edge values: the generated
    loader and `_load_fields` agree on every one."""
    cls, record = case
    raw: tuple[Any, ...] = unpack(packed(p.dump_struct(record)), size_max=1 << 20)  # type: ignore[assignment]
    for i, (_, rule) in enumerate(p.field_rules(cls)):
        for value in edges(rule):
            body = (*raw[:i], value, *raw[i + 1 :])
            assert loaded(p.load_struct, cls, body) == loaded(p.load_fields, cls, body)
