"""The rules of schema evolution (serializers/evolution.py) and the migration of stored values
(serializers/migration.py): a table of the rules, then random records evolved by random
changes against an oracle that applies the same changes to the record's fields."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamstate.format.codec import StateCodec
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers import (
    Compatibility,
    Int64Serializer,
    ListSerializer,
    StructSerializer,
    TtlValueSerializer,
    VoidNamespaceSerializer,
    serializer_for,
)
from streamstate.serializers.evolution import resolve_schema_change
from streamstate.serializers.migration import MigratingSerializer, migrating_serializer
from support import evolution_moved_types as moved
from support.evolution_types import (
    Acc,
    AccAdded,
    AccOptional,
    AccRemoved,
    AccRenamed,
    AccReordered,
    AccRequired,
    AccTagInt,
    AccWider,
    Color,
    ColorV2,
    Inner,
    InnerV2,
    Outer,
    OuterV2,
    Pair,
    PairV2,
    Point,
    PointV2,
)

AS_IS = Compatibility.COMPATIBLE_AS_IS
AFTER = Compatibility.COMPATIBLE_AFTER_MIGRATION
REFUSED = Compatibility.INCOMPATIBLE

RULES: list[tuple[Any, Any, Compatibility, str]] = [
    (int, float, AFTER, "int → float"),
    (float, int, REFUSED, "float → int"),
    (int, int | None, AFTER, "int → int | None"),
    (int | None, int, REFUSED, "int | None → int (None is no longer allowed)"),
    (str, bytes, AFTER, "str → bytes"),
    (bytes, str, AFTER, "bytes → str"),
    (str, int, REFUSED, "str → int"),
    (bool, int, REFUSED, "bool → int"),
    (list[int], list[float], AFTER, "int → float"),
    (list[int], set[int], REFUSED, "list[int] → set[int]"),
    (dict[str, int], dict[str, float], AFTER, "int → float"),
    (dict[str, int], dict[int, int], REFUSED, "map keys: str → int"),
    (tuple[int, str], tuple[float, str], AFTER, "int → float"),
    (tuple[int], tuple[int, int], REFUSED, "a tuple's length cannot change"),
    (Acc, Acc, AS_IS, ""),
    (Acc, AccAdded, AFTER, "AccAdded.extra: added with a default"),
    (Acc, AccRemoved, AFTER, "AccRemoved.tag: removed"),
    (Acc, AccReordered, AS_IS, "AccReordered: fields reordered"),
    (Acc, AccWider, AFTER, "AccWider.n: int → float"),
    (Acc, AccOptional, AFTER, "AccOptional.tag: str → str | None"),
    (Acc, AccRenamed, AS_IS, "record Acc is now AccRenamed"),
    (Acc, moved.Acc, AS_IS, ""),
    (Acc, AccTagInt, REFUSED, "AccTagInt.tag: str → int"),
    (Acc, AccRequired, REFUSED, "AccRequired.extra: added without a default"),
    (AccWider, Acc, REFUSED, "Acc.n: float → int"),
    (Outer, OuterV2, AFTER, "OuterV2.inner.x: int → float"),
    (Outer, OuterV2, AFTER, "OuterV2.scores[]: int → float"),
    (Point, PointV2, AFTER, "PointV2.label: added with a default"),
    (Pair, PairV2, AFTER, "PairV2.c: added with a default"),
    (Color, ColorV2, AFTER, "Color → ColorV2"),
    (ColorV2, Color, REFUSED, "values were removed"),
    (Literal["a"], Literal["a", "b"], AFTER, ""),
]


@pytest.mark.parametrize(("old", "new", "outcome", "words"), RULES)
def test_the_rules(old: Any, new: Any, outcome: Compatibility, words: str) -> None:
    change = resolve_schema_change(serializer_for(old).snapshot(), serializer_for(new).snapshot())
    assert change.compatibility is outcome, change
    said = change.refused if outcome is REFUSED else change.changes
    assert not words or any(words in text for text in said), said
    assert serializer_for(new).resolve_compatibility(serializer_for(old).snapshot()) is outcome
    for text in (*change.changes, *change.refused):
        assert "Serializer" not in text and "support." not in text  # the user's words


def test_time_to_live_turned_on_and_off_in_every_position() -> None:
    plain, ttl = Int64Serializer(), TtlValueSerializer(serializer_for(float))
    on = resolve_schema_change(plain.snapshot(), ttl.snapshot())
    assert on.compatibility is AFTER and not on.direct
    assert on.changes[0].startswith("time-to-live turned on")
    convert = on.converter()
    assert convert is not None and convert(3, 99) == [99, 3]
    off = resolve_schema_change(ttl.snapshot(), plain.snapshot())
    assert off.compatibility is REFUSED  # float → int under the wrapper
    off = resolve_schema_change(TtlValueSerializer(plain).snapshot(), plain.snapshot())
    assert off.compatibility is AFTER and off.converter()([5, 7], 0) == 7  # type: ignore[misc]
    elements = resolve_schema_change(
        ListSerializer(plain).snapshot(), ListSerializer(TtlValueSerializer(plain)).snapshot()
    )
    assert elements.converter()([1, 2], 9) == [[9, 1], [9, 2]]  # type: ignore[misc]


def test_snapshots_without_a_schema_are_left_to_the_serializer() -> None:
    from streamstate.serializers import PickleSerializer

    change = resolve_schema_change(PickleSerializer().snapshot(), Int64Serializer().snapshot())
    assert not change.known and change.compatibility is REFUSED
    assert migrating_serializer(PickleSerializer().snapshot(), Int64Serializer(), now=0) is None


# ---- the three forms a backend reads old values in ----------------------------------------------


def _read_all_ways(old: Any, new: Any, values: list[Any], now: int = 0) -> list[list[Any]]:
    """The old values read as new values from their stored bytes (RocksDB), from a snapshot
    file's section (the format's codec), and from values decoded with the old serializer."""
    old_s, new_s = serializer_for(old), serializer_for(new)
    reader = migrating_serializer(old_s.snapshot(), new_s, now=now)
    assert isinstance(reader, MigratingSerializer)
    stored = [reader.deserialize(old_s.serialize(v)) for v in values]
    column = [
        new_s.deserialize(b) for b in reader.convert_stored([old_s.serialize(v) for v in values])
    ]
    ns = VoidNamespaceSerializer()
    section = StateCodec(Int64Serializer(), ns, old_s).encode(
        [(i, VOID_NAMESPACE, v) for i, v in enumerate(values)]
    )
    from_file = StateCodec(Int64Serializer(), ns, reader).decode(section)[2]
    decoded = reader.convert_values([old_s.to_wire(v) for v in values])
    return [stored, column, from_file, decoded]


class Tagged(msgspec.Struct, tag=True):
    a: int


class TaggedV2(msgspec.Struct, tag=True):  # another tag (the class's name)
    a: float


class Wired(msgspec.Struct, rename="camel"):
    long_name: int


class WiredV2(msgspec.Struct):  # the field's wire name changes
    long_name: float


class Arr(msgspec.Struct, array_like=True):
    a: int
    b: str


class ArrV2(msgspec.Struct, array_like=True):  # reordered: stored by position
    b: str
    a: int


@dataclasses.dataclass
class Bytesy:
    data: str


@dataclasses.dataclass
class BytesyV2:
    data: bytes


MIGRATIONS: list[tuple[Any, Any, list[Any], list[Any]]] = [
    (Tagged, TaggedV2, [Tagged(1), Tagged(-2)], [TaggedV2(1.0), TaggedV2(-2.0)]),
    (Wired, WiredV2, [Wired(3)], [WiredV2(3.0)]),
    (Arr, ArrV2, [Arr(1, "x"), Arr(2, "y")], [ArrV2("x", 1), ArrV2("y", 2)]),
    (Bytesy, BytesyV2, [Bytesy("é")], [BytesyV2("é".encode())]),
    (str, bytes, ["a", "é"], [b"a", "é".encode()]),
    (int, int | None, [1, -5], [1, -5]),
    (int, float, [1, 2**40], [1.0, float(2**40)]),
    (list[int], list[float], [[1, 2], []], [[1.0, 2.0], []]),
    (Outer, OuterV2, [Outer(Inner(3), [1, 2])], [OuterV2(InnerV2(3.0), [1.0, 2.0])]),
]


@pytest.mark.parametrize(("old", "new", "values", "expected"), MIGRATIONS)
def test_every_form_of_an_old_value_reads_as_the_new_value(
    old: Any, new: Any, values: list[Any], expected: list[Any]
) -> None:
    for got in _read_all_ways(old, new, values):
        assert got == expected and [type(v) for v in got] == [type(v) for v in expected]


# ---- random records, random changes -------------------------------------------------------------

_LEAVES: list[tuple[Any, st.SearchStrategy[Any]]] = [
    (int, st.integers(-(2**40), 2**40)),
    (str, st.text(max_size=5)),
    (bool, st.booleans()),
    (float, st.floats(allow_nan=False, width=64)),
    (list[int], st.lists(st.integers(-100, 100), max_size=3)),
    (int | None, st.none() | st.integers(-9, 9)),
]

_WIDER = {int: float, str: bytes, list[int]: list[float]}
_NARROWER = {float: int, int | None: int, str: int}


@st.composite
def _record(draw: st.DrawFn, depth: int = 0) -> tuple[list[tuple[str, Any]], dict[str, Any]]:
    """Fields ``(name, type)`` (a nested record is ``("rec", fields)``) and a value as builtins."""
    n = draw(st.integers(1, 4))
    fields: list[tuple[str, Any]] = []
    value: dict[str, Any] = {}
    for i in range(n):
        name = f"f{i}"
        if depth < 1 and draw(st.integers(0, 5)) == 0:
            inner, inner_value = draw(_record(depth + 1))
            fields.append((name, ("rec", inner)))
            value[name] = inner_value
        else:
            tp, values = _LEAVES[draw(st.integers(0, len(_LEAVES) - 1))]
            fields.append((name, tp))
            value[name] = draw(values)
    return fields, value


def _type(name: str, fields: list[tuple[str, Any]], defaults: dict[str, Any]) -> Any:
    spec = []
    for field, tp in fields:
        real = _type(f"{name}_{field}", tp[1], {}) if isinstance(tp, tuple) else tp
        spec.append((field, real, defaults[field]) if field in defaults else (field, real))
    required = [s for s in spec if len(s) == 2]
    optional = [s for s in spec if len(s) == 3]
    return msgspec.defstruct(name, required + optional)


@st.composite
def _evolution(draw: st.DrawFn) -> tuple[Any, Any, Any, Any, bool]:
    """An old record type and value, a new type made by random changes, the value the old one
    becomes under those changes (the oracle), and whether the changes are all compatible."""
    fields, value = draw(_record())
    old = _type("Rec", fields, {})
    new_fields = list(fields)
    expected = dict(value)
    defaults: dict[str, Any] = {}
    refused: set[str] = set()  # fields narrowed, or added without a default
    added = iter(range(1_000))
    retyped: set[str] = set()
    for _ in range(draw(st.integers(1, 3))):
        what = draw(st.sampled_from(["add", "remove", "widen", "narrow", "reorder", "require"]))
        if what == "add":
            name = f"new{next(added)}"
            new_fields.append((name, int))
            defaults[name] = expected[name] = draw(st.integers(-5, 5))
        elif what == "remove" and len(new_fields) > 1:
            name, _ = new_fields.pop(draw(st.integers(0, len(new_fields) - 1)))
            expected.pop(name, None)
        elif what in ("widen", "narrow"):
            table = _WIDER if what == "widen" else _NARROWER
            candidates = [
                i
                for i, (n, tp) in enumerate(new_fields)
                if not isinstance(tp, tuple) and tp in table and n in value and n not in retyped
            ]
            if not candidates:
                continue
            i = draw(st.sampled_from(candidates))
            name, tp = new_fields[i]
            new_fields[i] = (name, table[tp])
            retyped.add(name)  # once: int -> float -> int is no change at all
            if what == "narrow":
                refused.add(name)
            elif tp is str:
                expected[name] = expected[name].encode()
            elif tp is int:
                expected[name] = float(expected[name])
            else:
                expected[name] = [float(x) for x in expected[name]]
        elif what == "reorder":
            new_fields.reverse()
        elif what == "require":
            name = f"new{next(added)}"
            new_fields.append((name, int))
            refused.add(name)
    new = _type("RecV2", new_fields, defaults)
    compatible = not refused & {name for name, _ in new_fields}
    oracle = None
    if compatible:
        oracle = msgspec.convert(expected, new)
    return old, new, msgspec.convert(value, old), oracle, compatible


@settings(max_examples=150, deadline=None)
@given(_evolution())
def test_random_records_migrate_as_the_oracle_says(drawn: tuple[Any, Any, Any, Any, bool]) -> None:
    old, new, value, oracle, compatible = drawn
    old_s, new_s = StructSerializer(old), StructSerializer(new)
    change = resolve_schema_change(old_s.snapshot(), new_s.snapshot())
    if not compatible:
        assert change.compatibility is REFUSED and change.refused
        return
    assert not change.compatibility.is_incompatible, change
    reader = migrating_serializer(old_s.snapshot(), new_s, now=0)
    assert reader is not None
    stored = old_s.serialize(value)
    ways = [reader.deserialize(stored)]
    if isinstance(reader, MigratingSerializer):
        ways.append(new_s.deserialize(reader.convert_stored([stored])[0]))
    section = StateCodec(Int64Serializer(), VoidNamespaceSerializer(), old_s).encode(
        [(1, VOID_NAMESPACE, value)]
    )
    ways.append(
        StateCodec(Int64Serializer(), VoidNamespaceSerializer(), reader).decode(section)[2][0]
    )
    for got in ways:
        assert msgspec.to_builtins(got) == msgspec.to_builtins(oracle)
        assert type(got) is new
