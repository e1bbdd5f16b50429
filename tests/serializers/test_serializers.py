"""Serializers: round trips, copies, snapshots, compatibility, pickle opt-in."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamstate.errors import PickleNotAllowedError
from streamstate.namespace import VOID_NAMESPACE, VoidNamespace
from streamstate.serializers import (
    BoolSerializer,
    BytesSerializer,
    Compatibility,
    DictSerializer,
    Float64Serializer,
    Int64Serializer,
    ListSerializer,
    OptionalSerializer,
    PickleSerializer,
    StrSerializer,
    StructSerializer,
    TupleSerializer,
    Types,
    serializer_for,
    serializer_from_snapshot,
)


@dataclasses.dataclass
class Point:
    x: int
    y: int = 0


@dataclasses.dataclass
class PointV2:
    x: int
    y: int = 0
    label: str = ""


class Event(msgspec.Struct):
    user: str
    amount: float
    tags: list[str] = []


class Frozen(msgspec.Struct, frozen=True):
    a: int
    b: str


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


CASES: list[tuple[Any, Any]] = [
    (int, 12345678901234),
    (int, -1),
    (float, 3.25),
    (bool, True),
    (str, "héllo 😀"),
    (bytes, b"\x00\xff"),
    (list[int], [1, 2, 3]),
    (dict[str, float], {"a": 1.5}),
    (tuple[int, str], (1, "a")),
    (int | None, None),
    (int | None, 7),
    (list[list[str]], [["a"], []]),
    (dict[int, list[int]], {1: [2, 3]}),
    (Point, Point(1, 2)),
    (Event, Event("u", 1.0, ["t"])),
    (Frozen, Frozen(1, "b")),
    (Color, Color.BLUE),
    (VoidNamespace, VOID_NAMESPACE),
]


@pytest.mark.parametrize(("tp", "value"), CASES)
def test_round_trip_bytes_and_wire(tp: Any, value: Any) -> None:
    s = serializer_for(tp)
    assert s.deserialize(s.serialize(value)) == value
    wire = msgspec.msgpack.encode(s.to_wire(value))
    assert s.from_wire(msgspec.msgpack.decode(wire, type=s.wire_type)) == value
    assert s.copy(value) == value
    rebuilt = serializer_from_snapshot(s.snapshot())
    assert rebuilt.snapshot() == s.snapshot()
    assert s.resolve_compatibility(s.snapshot()) is Compatibility.COMPATIBLE_AS_IS


def test_fixed_lengths() -> None:
    assert Int64Serializer().fixed_length == 8
    assert Float64Serializer().fixed_length == 8
    assert BoolSerializer().fixed_length == 1
    assert StrSerializer().fixed_length == -1


def test_copies_of_mutable_values_are_independent() -> None:
    s = serializer_for(dict[str, list[int]])
    v = {"a": [1]}
    c = s.copy(v)
    c["a"].append(2)
    assert v == {"a": [1]}
    ps = serializer_for(Point)
    p = Point(1)
    q = ps.copy(p)
    q.x = 5
    assert p.x == 1
    assert serializer_for(Frozen).copy(Frozen(1, "a")) is not None
    fs = serializer_for(Frozen)
    f = Frozen(1, "a")
    assert fs.immutable and fs.copy(f) is f


def test_immutable_flags() -> None:
    assert Int64Serializer().immutable and StrSerializer().immutable
    assert not ListSerializer(Int64Serializer()).immutable
    assert TupleSerializer(Int64Serializer(), StrSerializer()).immutable
    assert not serializer_for(Point).immutable


@given(
    st.lists(st.integers(-(2**63), 2**63 - 1)),
    st.dictionaries(st.text(), st.floats(allow_nan=False)),
)
def test_container_round_trip_property(ints: list[int], floats: dict[str, float]) -> None:
    ls = serializer_for(list[int])
    assert ls.deserialize(ls.serialize(ints)) == ints
    ds = serializer_for(dict[str, float])
    assert ds.deserialize(ds.serialize(floats)) == floats


def test_int64_out_of_range_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="64-bit"):
        Int64Serializer().serialize(2**64)


def test_compatibility_rules() -> None:
    old = serializer_for(Point).snapshot()
    assert old["version"] == 2 and "schema" in old
    assert serializer_for(Point).resolve_compatibility(old) is Compatibility.COMPATIBLE_AS_IS
    # judged by the fields, not by the class's name: PointV2 is Point with a field added
    assert (
        serializer_for(PointV2).resolve_compatibility(old)
        is Compatibility.COMPATIBLE_AFTER_MIGRATION
    )
    assert Int64Serializer().resolve_compatibility(StrSerializer().snapshot()).is_incompatible
    assert (
        OptionalSerializer(Int64Serializer()).resolve_compatibility(Int64Serializer().snapshot())
        is Compatibility.COMPATIBLE_AFTER_MIGRATION
    )
    assert (
        ListSerializer(Int64Serializer())
        .resolve_compatibility(ListSerializer(StrSerializer()).snapshot())
        .is_incompatible
    )


def test_version_1_record_snapshots_are_judged_by_their_fields() -> None:
    v1 = serializer_for(Point).v1_snapshot()  # what checkpoints written before version 2 hold
    assert v1["version"] == 1 and "fields" in v1 and "schema" not in v1
    assert serializer_for(Point).resolve_compatibility(v1) is Compatibility.COMPATIBLE_AS_IS
    assert (
        serializer_for(PointV2).resolve_compatibility(v1)
        is Compatibility.COMPATIBLE_AFTER_MIGRATION
    )
    # a field added with a default (the checkpoint's record lacked y)
    added = dict(v1, fields=[f for f in v1["fields"] if f["name"] != "y"])
    assert (
        serializer_for(Point).resolve_compatibility(added)
        is Compatibility.COMPATIBLE_AFTER_MIGRATION
    )
    # a required field added: incompatible
    missing_required = dict(v1, fields=[f for f in v1["fields"] if f["name"] != "x"])
    assert (
        serializer_for(Point).resolve_compatibility(missing_required) is Compatibility.INCOMPATIBLE
    )
    # a changed field type, read from the version-1 text
    changed = dict(
        v1, fields=[dict(f, type="StrType()") if f["name"] == "x" else f for f in v1["fields"]]
    )
    assert serializer_for(Point).resolve_compatibility(changed) is Compatibility.INCOMPATIBLE
    # text that is no schema: the version-1 rules (same class and field types) decide
    unreadable = dict(
        v1, fields=[dict(f, type="Weird(") if f["name"] == "x" else f for f in v1["fields"]]
    )
    assert serializer_for(Point).resolve_compatibility(unreadable) is Compatibility.INCOMPATIBLE
    same_text = serializer_for(Point).v1_snapshot()
    assert serializer_for(Point).resolve_compatibility(same_text) is Compatibility.COMPATIBLE_AS_IS


def test_pickle_is_never_implicit() -> None:
    with pytest.raises(TypeError, match="PickleSerializer"):
        serializer_for(object)
    with pytest.raises(TypeError, match="element types"):
        serializer_for(list)
    with pytest.raises(TypeError, match="pickle"):
        serializer_for(type("Opaque", (), {}))


def test_pickle_serializer_explicit_opt_in() -> None:
    s = PickleSerializer()
    value = {"set": {1, 2}, "fn": len}
    assert s.deserialize(s.serialize(value)) == value
    assert not s.wire_native
    assert s.from_wire(s.to_wire(value)) == value
    with pytest.raises(PickleNotAllowedError, match="PickleSerializer"):
        serializer_from_snapshot(s.snapshot())
    assert isinstance(serializer_from_snapshot(s.snapshot(), allow_pickle=True), PickleSerializer)
    nested = ListSerializer(PickleSerializer())
    with pytest.raises(PickleNotAllowedError):
        serializer_from_snapshot(nested.snapshot())


def test_a_struct_snapshot_imports_no_module_and_reaches_only_classes(tmp_path: Any) -> None:
    """A checkpoint names the record type of its state; whoever writes the checkpoint must not
    make the reader import a module of their choice, nor reach an object that is no class."""
    import sys

    marker = tmp_path / "imported"
    (tmp_path / "checkpoint_payload.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\nclass Rec:\n    pass\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(TypeError, match="which this program has not imported"):
            serializer_from_snapshot({"type": "struct", "class": "checkpoint_payload:Rec"})
    finally:
        sys.path.remove(str(tmp_path))
    assert not marker.exists() and "checkpoint_payload" not in sys.modules
    for name in ("os:system", "os:environ", "streamstate.serializers:serializer_for"):
        with pytest.raises(TypeError, match="not a class defined in"):
            serializer_from_snapshot({"type": "struct", "class": name})
    with pytest.raises(TypeError, match="has no"):
        serializer_from_snapshot({"type": "struct", "class": "os:NoSuchThing"})
    # the program's own types (its module is imported) and the standard library's rebuild
    import datetime

    for tp in (Event, Color, datetime.datetime):
        assert serializer_from_snapshot(serializer_for(tp).snapshot()).snapshot() == (
            serializer_for(tp).snapshot()
        )


def test_types_helpers_match_pyflink_names() -> None:
    assert isinstance(Types.LONG(), Int64Serializer)
    assert isinstance(Types.INT(), Int64Serializer)
    assert isinstance(Types.STRING(), StrSerializer)
    assert isinstance(Types.DOUBLE(), Float64Serializer)
    assert isinstance(Types.BOOLEAN(), BoolSerializer)
    assert isinstance(Types.BYTES(), BytesSerializer)
    assert Types.LIST(Types.STRING()) == ListSerializer(StrSerializer())
    assert Types.MAP(str, int) == DictSerializer(StrSerializer(), Int64Serializer())
    assert Types.TUPLE([int, str]) == TupleSerializer(Int64Serializer(), StrSerializer())
    assert isinstance(Types.RECORD(Point), StructSerializer)
    assert isinstance(Types.PICKLED_BYTE_ARRAY(), PickleSerializer)


def test_validate_names_the_problem() -> None:
    with pytest.raises(TypeError, match="cannot be written"):
        Int64Serializer().validate("x")
    Int64Serializer().validate(3)
    with pytest.raises(TypeError):
        serializer_for(list[int]).validate([1, "a"])


def test_window_serializers_are_rebuilt_as_themselves() -> None:
    """A checkpoint's window namespace serializer comes back with the same snapshot, so a state
    restored without its descriptor (a backend switch) stays compatible with the program's."""
    from streamstate.serializers.window_namespaces import (
        GlobalWindow,
        GlobalWindowSerializer,
        TimeWindow,
        TimeWindowSerializer,
    )

    for s, value in (
        (TimeWindowSerializer(), TimeWindow(-5, 5)),
        (GlobalWindowSerializer(), GlobalWindow()),
    ):
        rebuilt = serializer_from_snapshot(s.snapshot())
        assert type(rebuilt) is type(s) and rebuilt.snapshot() == s.snapshot()
        assert rebuilt.deserialize(s.serialize(value)) == value
        assert s.resolve_compatibility(rebuilt.snapshot()) is Compatibility.COMPATIBLE_AS_IS
