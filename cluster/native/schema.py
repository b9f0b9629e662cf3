"""How a native message is shaped: the rule each field carries (type and range of an integer,
length of a string, count of a tuple, the record of a nested array, statemachine/fields.py's
scalars and the wire's own), the `Struct` base, and each record class as the array of its
fields and back, through a loader generated once from its rules (`_loader`, as `dataclasses`
generates an `__init__`: nothing read from the wire ever becomes code).

Bounds here are shape, not meaning: a topic name is a string of at most `NAME_CHARS_MAX`
characters (looser than the name rules, which the server checks with `topic_name_error`, so a
bad name gets INVALID_TOPIC_EXCEPTION); ranges match the commands the server proposes, so a
request that decodes never makes a command that does not. Counts of partitions in a request
(and in its response) are bounded by `Limits.partitions_per_request_max`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import MISSING, dataclass
from typing import Any, ClassVar, NamedTuple, TypeVar

from cluster.config import Limits
from cluster.errors import ProtocolError
from statemachine.commands import INT32_MAX
from statemachine.errors import ErrorCode
from statemachine.fields import (
    BoolRule,
    BytesRule,
    ErrorCodeRule,
    FieldError,
    IntRule,
    Scalar,
    StrRule,
    rule,
    rules_of,
)
from statemachine.limits import DEFAULT_LIMITS
from statemachine.records import INT64_MAX

NAME_CHARS_MAX = 1_024  # topic names, transactional ids, cluster ids, group names
TEXT_CHARS_MAX = 4_096  # error messages and health details
ADDRESS_CHARS_MAX = DEFAULT_LIMITS.address_length_max
TIMEOUT_MS_MAX = 3_600_000
EARLIEST = -2
LATEST = -1


DEFAULT_WIRE_LIMITS = Limits()


# -- Field rules: statemachine/fields.py's scalars, and the wire's nested records and arrays -----

Bound = Callable[[Limits], int]


def per_request(limits: Limits) -> int:
    return limits.partitions_per_request_max


def per_frame(limits: Limits) -> int:
    return limits.frame_bytes_max


def at_most(count: int) -> Bound:
    return lambda _limits: count


@dataclass(frozen=True, slots=True)
class StructRule:
    """A nested record, encoded as the array of its fields."""

    cls: type[Struct]
    AS_IS: ClassVar[bool] = False

    def load(self, value: object, limits: Limits) -> object:
        return load_struct(self.cls, value, limits)

    def dump(self, value: object) -> object:
        return dump_struct(value)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class TupleRule:
    """A tuple of items of one rule; `bound(limits)` is the largest count accepted."""

    item: Rule
    bound: Bound
    AS_IS: ClassVar[bool] = False

    def load(self, value: object, limits: Limits) -> object:
        if type(value) is not tuple:
            raise FieldError("expected an array")
        count_max = self.bound(limits)
        if len(value) > count_max:
            raise FieldError(f"expected at most {count_max} items")
        load, items = self.item.load, []
        try:
            for item in value:
                items.append(load(item, limits))
        except FieldError as exc:
            raise exc.at(f"[{len(items)}]") from None  # the items before it loaded
        return tuple(items)

    def dump(self, value: object) -> object:
        if self.item.AS_IS:
            return value  # a tuple of plain values: msgpack writes it as the array it is
        dump = self.item.dump
        return [dump(item) for item in value]  # type: ignore[attr-defined]


Rule = Scalar | StructRule | TupleRule


def field_of(spec: Rule, default: object = MISSING) -> Any:
    return rule(spec, default)


def int_field(lo: int, hi: int, default: object = MISSING) -> Any:
    return field_of(IntRule(lo, hi), default)


def str_field(chars_max: int) -> Any:
    return field_of(StrRule(chars_max))


def many_field(item: Rule | type[Struct], bound: Bound) -> Any:
    item_rule = item if not isinstance(item, type) else StructRule(item)
    return field_of(TupleRule(item_rule, bound))


NAME_RULE = StrRule(NAME_CHARS_MAX)
TEXT_RULE = StrRule(TEXT_CHARS_MAX)
PARTITION_RULE = IntRule(0, INT32_MAX)
NODE_ID_RULE = IntRule(0, INT32_MAX)
LEADER_ID_RULE = IntRule(-1, INT32_MAX)  # -1: unknown
COUNT_RULE = IntRule(1, INT32_MAX)
OFFSET_RULE = IntRule(0, INT64_MAX)
OFFSET_OR_NONE_RULE = IntRule(-1, INT64_MAX)  # -1 where an error leaves no offset
BYTES_RULE = IntRule(0, INT32_MAX)
TIMEOUT_RULE = IntRule(0, TIMEOUT_MS_MAX)
TIME_MS_RULE = IntRule(0, INT64_MAX)
SEQUENCE_RULE = IntRule(0, INT32_MAX)


# A dataclass takes ownership of each Field it is given, so every field gets a fresh one.
def name_field() -> Any:
    return field_of(NAME_RULE)


def partition_field() -> Any:
    return field_of(PARTITION_RULE)


def address_field() -> Any:
    """An address field: "host:port", or "" when unknown."""
    return str_field(ADDRESS_CHARS_MAX)


def error_field(default: object = MISSING) -> Any:
    return field_of(ErrorCodeRule(), default)


def flag_field(default: object = MISSING) -> Any:
    return field_of(BoolRule(), default)


def blob_field() -> Any:
    return field_of(BytesRule())


class Struct:
    """A record on the wire: a frozen dataclass whose fields each carry a rule."""

    __slots__ = ()


# -- Records <-> arrays --------------------------------------------------------------------------

S = TypeVar("S", bound=Struct)


class _Plan(NamedTuple):
    """A record class's rules, prepared once for both directions."""

    rules: tuple[tuple[str, Rule], ...]
    loads: tuple[Callable[[object, Limits], object], ...]
    values_of: Callable[[Any], tuple[object, ...]]  # every field's value, in one call
    dumps: tuple[tuple[int, Callable[[object], object]], ...]  # the fields not written as is
    load: Callable[[object, Limits], Any]  # `load_fields`, as one function of the class


_PLANS: dict[type[Struct], _Plan] = {}


def _new_plan(cls: type[Struct]) -> _Plan:
    """Prepare `cls` (once: callers look in `_PLANS` first, which saves a call per record)."""
    rules = rules_of(cls)
    plan = _PLANS[cls] = _Plan(
        rules,
        tuple(rule.load for _, rule in rules),
        _values_getter([name for name, _ in rules]),
        tuple((i, rule.dump) for i, (_, rule) in enumerate(rules) if not rule.AS_IS),
        _loader(cls, rules),
    )
    return plan


def _loader(cls: type[S], rules: tuple[tuple[str, Rule], ...]) -> Callable[[object, Limits], S]:
    """`load_fields` for `cls` as one function: each scalar's rule is the test it makes,
    written inline (an IntRule `type(v) is int and lo <= v <= hi`, ...), nested records and
    tuples go through their rules, and a body any of them does not accept goes to
    `load_fields`, which accepts it after all or raises naming the field and the reason.

    Generated source, as `dataclasses` makes `__init__`: from this module's rules (integers
    and local names) only; nothing read from the wire is ever part of it. Same values, same
    errors as `load_fields` (tests/property/test_protocol_roundtrip.py)."""
    names = [f"v{i}" for i in range(len(rules))]
    tests: list[str] = []
    args: list[str] = []
    scope: dict[str, Any] = {"cls": cls, "FieldError": FieldError, "fields": load_fields}
    for i, (v, (_, spec)) in enumerate(zip(names, rules, strict=True)):
        match spec:
            case IntRule(lo=lo, hi=hi):
                tests.append(f"type({v}) is int and {lo} <= {v} <= {hi}")
            case StrRule(chars_max=chars_max):
                tests.append(f"type({v}) is str and len({v}) <= {chars_max}")
            case BoolRule():
                tests.append(f"type({v}) is bool")
            case BytesRule():
                tests.append(f"type({v}) is bytes")
            case _:
                scope[f"load{i}"] = spec.load
                args.append(f"load{i}({v}, limits)")
                continue
        args.append(v)
    unpacked = "".join(f"{v}, " for v in names) or "_"  # `_ = ()` for a class of no fields
    source = "\n".join(
        [
            "def load(raw, limits):",
            f"    if type(raw) is tuple and len(raw) == {len(names)}:",
            f"        {unpacked} = raw",
            f"        if {' and '.join(tests) or 'True'}:",
            "            try:",
            f"                return cls({', '.join(args)})",
            "            except FieldError:",
            "                pass",
            "    return fields(cls, raw, limits)",
        ]
    )
    exec(source, scope)  # generated from the rules above, never from input
    load: Callable[[object, Limits], S] = scope["load"]
    return load


def _values_getter(names: list[str]) -> Callable[[Any], tuple[object, ...]]:
    if len(names) > 1:
        return operator.attrgetter(*names)  # a tuple of the values, in one C call
    return lambda value: tuple(getattr(value, name) for name in names)


def field_rules(cls: type[Struct]) -> tuple[tuple[str, Rule], ...]:
    """The (name, rule) of each field of a record class, in encoding order."""
    return (_PLANS.get(cls) or _new_plan(cls)).rules


def dump_struct(value: Struct) -> object:
    plan = _PLANS.get(type(value)) or _new_plan(type(value))
    values = plan.values_of(value)
    if not plan.dumps:
        return values  # msgpack writes the tuple as the array of the fields
    dumped = list(values)
    for i, dump in plan.dumps:
        dumped[i] = dump(dumped[i])
    return dumped


def load_struct(cls: type[S], raw: object, limits: Limits) -> S:
    plan = _PLANS.get(cls) or _new_plan(cls)
    load: Callable[[object, Limits], S] = plan.load
    return load(raw, limits)


def load_fields(cls: type[S], raw: object, limits: Limits) -> S:
    """A body's record, field by field: the reference loader, and the one that names the
    field (and the reason) a body breaks."""
    plan = _PLANS.get(cls) or _new_plan(cls)
    if type(raw) is not tuple or len(raw) != len(plan.loads):
        raise FieldError(f"expected an array of {len(plan.loads)} fields")
    values: list[object] = []
    try:
        for load, value in zip(plan.loads, raw, strict=True):
            values.append(load(value, limits))
    except FieldError as exc:
        raise exc.at(f".{plan.rules[len(values)][0]}") from None  # the fields before it loaded
    return cls(*values)


def load_payload(cls: type[S], raw: object, limits: Limits, correlation_id: int) -> S:
    try:
        return load_struct(cls, raw, limits)
    except FieldError as exc:
        message = f"{cls.__name__}{exc.path}: {exc.reason}"
        raise ProtocolError(ErrorCode.INVALID_REQUEST, message, correlation_id) from None
