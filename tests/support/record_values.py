"""Random record types and values, and both sides of comparing a record decoded from its
schema alone with the value written (the serializers' tests)."""

from __future__ import annotations

import dataclasses
import datetime
import enum
from typing import Any

import msgspec
from hypothesis import strategies as st

from streamstate.serializers.snapshot_schema import PlainRecord

__all__ = ["SCALARS", "expected_builtins", "plain_builtins", "record_type_and_value"]


def plain_builtins(value: Any) -> Any:
    """A decoded plain value as builtins keyed by Python field names."""
    if isinstance(value, PlainRecord):
        return {f: plain_builtins(getattr(value, f)) for f in value.__struct_fields__}
    if isinstance(value, dict):
        return {k: plain_builtins(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_builtins(v) for v in value]
    return value


def expected_builtins(value: Any) -> Any:
    """The same, from the original value."""
    if isinstance(value, msgspec.Struct):
        return {f: expected_builtins(getattr(value, f)) for f in value.__struct_fields__}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return {f.name: expected_builtins(getattr(value, f.name)) for f in fields}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {f: expected_builtins(getattr(value, f)) for f in value._fields}
    if isinstance(value, dict):
        return {k: expected_builtins(v) for k, v in value.items()}
    if isinstance(value, list | tuple | frozenset | set):
        return [expected_builtins(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value


SCALARS: list[tuple[Any, st.SearchStrategy[Any]]] = [
    (int, st.integers(-(2**63), 2**63 - 1)),
    (float, st.floats(allow_nan=False)),
    (str, st.text(max_size=5)),
    (bool, st.booleans()),
    (bytes, st.binary(max_size=5)),
    (datetime.date, st.dates()),
]


@st.composite
def record_type_and_value(draw: st.DrawFn, depth: int = 0) -> tuple[Any, Any]:
    """A random dataclass (scalars, lists, optionals, dicts, nested records) and a value of it."""

    def field(d: int) -> tuple[Any, st.SearchStrategy[Any]]:
        tp, values = draw(st.sampled_from(SCALARS))
        shape = draw(
            st.sampled_from(["plain", "list", "optional", "dict", "record"][: 5 - (d >= 2)])
        )
        if shape == "list":
            return list[tp], st.lists(values, max_size=3)  # type: ignore[valid-type]
        if shape == "optional":
            return tp | None, st.none() | values
        if shape == "dict":
            return dict[str, tp], st.dictionaries(st.text(max_size=3), values, max_size=3)  # type: ignore[valid-type]
        if shape == "record":
            inner, inner_value = draw(record_type_and_value(d + 1))
            return inner, st.just(inner_value)
        return tp, values

    fields = [field(depth) for _ in range(draw(st.integers(0, 4)))]
    cls = dataclasses.make_dataclass(f"R{depth}", [(f"f{i}", t) for i, (t, _) in enumerate(fields)])
    return cls, cls(*(draw(v) for _, v in fields))
