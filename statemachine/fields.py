"""Field rules: the type and range each field of a frozen dataclass accepts.

Role: the one set of scalar rules behind both strict decoders of the project, the replicated
commands (statemachine/commands.py) and the client wire (cluster/protocol.py, which adds its
nested records and bounded arrays on top), and the one check that a settings dataclass holds
positive integers (StateLimits here, Limits and Timing in cluster/config.py).

Rules:
- A field declares its rule in its metadata (`rule(IntRule(0, 10))`); a decoder reads the
  rules of a class once (`rules_of`) and calls `load` per value.
- `load(value, context)` returns the value to keep or raises `FieldError` with the reason; the
  context is for rules that need one (the wire's limits bound its arrays), scalars ignore it.
- Types are exact: a bool is not an integer, a str is not bytes.
- `AS_IS`: the value is written as it is, so an encoder skips `dump` for it.
- Pure: nothing outside statemachine/ is imported (tests/unit/test_purity.py).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

from statemachine.errors import ErrorCode

# A string bounded only by the entry or frame that carries it.
UNBOUNDED = 2**63 - 1


class FieldError(ValueError):
    """A value that breaks its rule; `path` locates it below the record being decoded."""

    def __init__(self, reason: str, path: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.path = path

    def at(self, prefix: str) -> FieldError:
        return FieldError(self.reason, prefix + self.path)


class ScalarRule:
    """A rule whose values msgpack writes as they are: its dump is the identity."""

    __slots__ = ()
    AS_IS: ClassVar[bool] = True

    def dump(self, value: object) -> object:
        return value


@dataclass(frozen=True, slots=True)
class IntRule(ScalarRule):
    """An integer (never a bool) within [lo, hi]."""

    lo: int
    hi: int

    def load(self, value: object, _context: object = None) -> object:
        if type(value) is not int or not self.lo <= value <= self.hi:
            raise FieldError(f"expected an integer in [{self.lo}, {self.hi}]")
        return value


@dataclass(frozen=True, slots=True)
class BoolRule(ScalarRule):
    def load(self, value: object, _context: object = None) -> object:
        if type(value) is not bool:
            raise FieldError("expected a bool")
        return value


@dataclass(frozen=True, slots=True)
class StrRule(ScalarRule):
    """A string of at most `chars_max` characters (valid UTF-8 on the wire)."""

    chars_max: int = UNBOUNDED

    def load(self, value: object, _context: object = None) -> object:
        if type(value) is not str or len(value) > self.chars_max:
            if self.chars_max == UNBOUNDED:
                raise FieldError("expected a string")
            raise FieldError(f"expected a string of at most {self.chars_max} characters")
        return value


@dataclass(frozen=True, slots=True)
class BytesRule(ScalarRule):
    """Opaque bytes (msgpack bin), bounded by the entry or frame that carries them."""

    def load(self, value: object, _context: object = None) -> object:
        if type(value) is not bytes:
            raise FieldError("expected bytes")
        return value


_ERROR_CODES = {int(code): code for code in ErrorCode}


def known_error_code(value: object) -> ErrorCode | None:
    """The ErrorCode member whose value `value` is (an int, never a bool), else None."""
    return _ERROR_CODES.get(value) if type(value) is int else None


@dataclass(frozen=True, slots=True)
class ErrorCodeRule(ScalarRule):
    """An ErrorCode value; it loads as the enum member (an IntEnum, written as its value)."""

    def load(self, value: object, _context: object = None) -> object:
        code = _ERROR_CODES.get(value) if type(value) is int else None  # known_error_code, inline
        if code is None:
            raise FieldError("expected a known error code")
        return code


Scalar = IntRule | BoolRule | StrRule | BytesRule | ErrorCodeRule


def rule(spec: object, default: object = MISSING) -> Any:
    """The dataclass field of a value under `spec` (a fresh Field: a dataclass owns each).
    A `default` is the constructor's only: a field is on the wire whether it has one or not."""
    return field(default=default, metadata={"rule": spec})


def rules_of(cls: type) -> tuple[tuple[str, Any], ...]:
    """The (name, rule) of each field of a dataclass of rule fields, in field order."""
    return tuple((f.name, f.metadata["rule"]) for f in fields(cls))


def check_positive_ints(settings: object, error: type[ValueError] = ValueError) -> None:
    """Every field of the dataclass `settings` is an int above zero (never a bool), or `error`
    naming the first that is not."""
    for f in fields(settings):  # type: ignore[arg-type]
        value = getattr(settings, f.name)
        if type(value) is not int or value <= 0:
            name = f"{type(settings).__name__}.{f.name}"
            raise error(f"{name} must be a positive integer, not {value!r}")
