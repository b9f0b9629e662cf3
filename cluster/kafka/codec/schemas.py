"""kio's classes, one per message and version, and how our classes map onto them: fields by
name, their kinds, and the conversions of values. Part of the codec
(cluster/kafka/codec/__init__.py has its rules).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import types
import typing
from collections.abc import Callable
from typing import Any, NamedTuple

import kio.schema.errors
import kio.serial
import kio.serial.errors
from kio.index import KioIndexError, load_request_schema, load_response_schema
from kio.serial._implicit_defaults import get_tagged_field_default

# -- kio's classes -------------------------------------------------------------------------------


# Cached: kio resolves a schema's class by its module path on every call (a fifth of the cost
# of a one-record Produce, decoded and answered, before the cache).
@functools.cache
def _request_schema(api_key: int, version: int) -> type[Any]:
    try:
        return load_request_schema(api_key, version)
    except KioIndexError:
        raise AssertionError(f"no kio schema for API {api_key} v{version}") from None


@functools.cache
def _response_schema(api_key: int, version: int) -> type[Any]:
    try:
        return load_response_schema(api_key, version)
    except KioIndexError:
        raise AssertionError(f"no kio schema for API {api_key} v{version}") from None


def schema_exists(api_key: int, version: int) -> bool:
    """Whether kio knows this API version, both ways (the version table is checked with it)."""
    try:
        load_request_schema(api_key, version)
        load_response_schema(api_key, version)
    except KioIndexError:
        return False
    return True


class _Kind(NamedTuple):
    """How one field of a class is laid out: an array or not, a nested class or not."""

    array: bool
    nested: type[Any] | None  # a nested class (kio's or ours), else a primitive
    nullable: bool


def _kind(annotation: object) -> _Kind:
    nullable = False
    if typing.get_origin(annotation) in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(annotation))
        annotation = args[0]
    if typing.get_origin(annotation) is tuple:
        item = typing.get_args(annotation)[0]
        is_class = isinstance(item, type) and dataclasses.is_dataclass(item)
        return _Kind(True, item if is_class else None, nullable)
    nested = (
        annotation
        if isinstance(annotation, type) and dataclasses.is_dataclass(annotation)
        else None
    )
    return _Kind(False, nested, nullable)


class _Field(NamedTuple):
    name: str
    kafka_type: str
    kind: _Kind
    tag: int | None
    required: bool  # no default: our value must be given


# Each class's fields, read once (caches: kio's classes and ours never change).
_KIO_FIELDS: dict[type, tuple[_Field, ...]] = {}


_OUR_KINDS: dict[type, dict[str, _Kind]] = {}


def _kio_fields(kio_cls: type) -> tuple[_Field, ...]:
    found = _KIO_FIELDS.get(kio_cls)
    if found is None:
        found = _KIO_FIELDS[kio_cls] = _read_kio_fields(kio_cls)
    return found


def _read_kio_fields(kio_cls: type) -> tuple[_Field, ...]:
    assert dataclasses.is_dataclass(kio_cls)
    return tuple(
        _Field(
            f.name,
            f.metadata.get("kafka_type", ""),
            _kind(f.type),
            f.metadata.get("tag"),
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(kio_cls)
    )


def _our_kinds(cls: type) -> dict[str, _Kind]:
    found = _OUR_KINDS.get(cls)
    if found is None:
        assert dataclasses.is_dataclass(cls)
        hints = typing.get_type_hints(cls)
        found = _OUR_KINDS[cls] = {f.name: _kind(hints[f.name]) for f in dataclasses.fields(cls)}
    return found


# Conversions between our values and kio's, by the kio field's kafka_type.
def _ms_to_timedelta(value: Any) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=value)


def _timedelta_to_ms(value: datetime.timedelta) -> int:
    return round(value.total_seconds() * 1000)


def _ms_to_time(value: Any) -> datetime.datetime:
    """A time in ms since the epoch; Kafka's -1 ("none") too, a millisecond before the epoch,
    which kio writes back as -1 whether or not its field is nullable."""
    return datetime.datetime.fromtimestamp(value / 1000, tz=datetime.UTC)


def _time_to_ms(value: Any) -> int:
    return -1 if value is None else round(value.timestamp() * 1000)


_TO_KIO: dict[str, Callable[[Any], Any]] = {
    "error_code": kio.schema.errors.ErrorCode,
    "timedelta_i32": _ms_to_timedelta,
    "timedelta_i64": _ms_to_timedelta,
    "datetime_i64": _ms_to_time,
}


_FROM_KIO: dict[str, Callable[[Any], Any]] = {
    "error_code": int,
    "timedelta_i32": _timedelta_to_ms,
    "timedelta_i64": _timedelta_to_ms,
    "datetime_i64": _time_to_ms,
}


# How a field's value crosses between the two sides: as it is, each item of a nested array,
# a nested entity, each item of an array converted, or converted.
_AS_IS, _NESTED_ARRAY, _NESTED, _CONVERT_ARRAY, _CONVERT = range(5)


_Plan = tuple[tuple[str, int, Any], ...]  # (field name, how, the nested class or converter)


def _how(
    nested: type[Any] | None, array: bool, convert: Callable[[Any], Any] | None
) -> tuple[int, Any]:
    if nested is not None:
        return (_NESTED_ARRAY if array else _NESTED), nested
    if convert is not None:
        return (_CONVERT_ARRAY if array else _CONVERT), convert
    return _AS_IS, None


_TO_KIO_PLANS: dict[tuple[type, type], _Plan] = {}


_FROM_KIO_PLANS: dict[tuple[type, type], _Plan] = {}


def _to_kio_plan(kio_cls: type[Any], cls: type[Any]) -> _Plan:
    found = _TO_KIO_PLANS.get((kio_cls, cls))
    if found is None:
        found = _TO_KIO_PLANS[kio_cls, cls] = _make_to_kio_plan(kio_cls, cls)
    return found


def _from_kio_plan(cls: type[Any], kio_cls: type[Any]) -> _Plan:
    found = _FROM_KIO_PLANS.get((cls, kio_cls))
    if found is None:
        found = _FROM_KIO_PLANS[cls, kio_cls] = _make_from_kio_plan(cls, kio_cls)
    return found


def _make_to_kio_plan(kio_cls: type[Any], cls: type[Any]) -> _Plan:
    """Once per pair of classes: which of kio's fields ours gives, and how. A field of kio's
    that ours lacks is left to kio's default (it must have one)."""
    ours = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    plan = []
    for field in _kio_fields(kio_cls):
        if field.name not in ours and not isinstance(getattr(cls, field.name, None), property):
            assert not field.required, f"{cls.__name__} lacks {field.name}"
            continue
        how = _how(field.kind.nested, field.kind.array, _TO_KIO.get(field.kafka_type))
        plan.append((field.name, *how))
    return tuple(plan)


def _make_from_kio_plan(cls: type[Any], kio_cls: type[Any]) -> _Plan:
    """Once per pair of classes: which of our fields this version of kio's class carries (the
    others take our defaults), and how."""
    kio_fields = {f.name: f for f in _kio_fields(kio_cls)}
    plan = []
    for name, kind in _our_kinds(cls).items():
        field = kio_fields.get(name)
        if field is None:
            continue
        # A nested value is an array by our annotation, a converted one by kio's.
        array = kind.array if kind.nested is not None else field.kind.array
        plan.append((name, *_how(kind.nested, array, _FROM_KIO.get(field.kafka_type))))
    return tuple(plan)


def _convert(how: int, arg: Any, value: Any, nested: Callable[[Any, Any], Any]) -> Any:
    if how == _NESTED_ARRAY:
        return tuple([nested(arg, item) for item in value])
    if how == _NESTED:
        return nested(arg, value)
    if how == _CONVERT_ARRAY:
        return tuple(map(arg, value))
    return arg(value)


def _to_kio(kio_cls: type[Any], ours: object) -> Any:
    return _mapped(kio_cls, ours, _to_kio_plan(kio_cls, type(ours)), _to_kio)


def _from_kio(cls: type[Any], entity: object) -> Any:
    return _mapped(cls, entity, _from_kio_plan(cls, type(entity)), _from_kio)


def _mapped(
    target: type[Any], source: object, plan: _Plan, nested: Callable[[Any, Any], Any]
) -> Any:
    """`target` built from `source`'s fields as `plan` says, nested ones through `nested`."""
    values: dict[str, Any] = {}
    for name, how, arg in plan:
        value = getattr(source, name)
        if how and value is not None:
            value = _convert(how, arg, value, nested)
        values[name] = value
    return target(**values)


def _our_tag_default(field: dataclasses.Field[Any], how: tuple[int, Any]) -> Any:
    """What our field holds when its tag is absent: kio's default, converted as `_from_kio`
    converts it (`how`: the field's step of `_from_kio_plan`)."""
    has_default = (
        field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
    )
    value = _kio_default(field) if has_default else get_tagged_field_default(field)
    if how[0] == _AS_IS or value is None:
        return value
    return _convert(how[0], how[1], value, _from_kio)


def _kio_default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    assert field.default_factory is not dataclasses.MISSING, f"{field.name} has no default"
    return field.default_factory()
