"""Serializers rebuilt from a snapshot alone read what the program's serializers wrote, in both
encodings a checkpoint holds (a canonical file's wire values, a RocksDB entry's bytes), for
random record types, containers of them, TTL pairs, pickled values and the earliest record
snapshots (whose top-level record may be a msgpack map or array)."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import msgspec
from hypothesis import given, settings

from streamstate.serializers import (
    DictSerializer,
    Int64Serializer,
    ListSerializer,
    OptionalSerializer,
    PickleSerializer,
    StrSerializer,
    StructSerializer,
    TtlValueSerializer,
    TupleSerializer,
)
from streamstate.serializers.plain import (
    GenericSerializer,
    PickledBytesSerializer,
    PlainRecordSerializer,
    plain_serializer_from_snapshot,
    readable_schema,
)
from streamstate.serializers.schema import describe_schema
from support.record_values import expected_builtins, plain_builtins, record_type_and_value


def _both_ways(written: Any, value: Any) -> tuple[Any, Any]:
    """``value`` written by ``written``, read back by its plain twin from RocksDB's bytes and
    from a canonical file's wire value."""
    plain = plain_serializer_from_snapshot(written.snapshot())
    from_bytes = plain.deserialize(written.serialize(value))
    wire = msgspec.msgpack.encode(written.to_wire(value))
    from_wire = plain.from_wire(msgspec.msgpack.decode(wire, type=plain.wire_type))
    return from_bytes, from_wire


@settings(max_examples=60, deadline=None)
@given(record_type_and_value())
def test_random_records_and_containers_of_them_read_back(drawn: tuple[Any, Any]) -> None:
    cls, value = drawn
    expected = expected_builtins(value)
    for written, shaped, want in (
        (StructSerializer(cls), value, expected),
        (ListSerializer(StructSerializer(cls)), [value, value], [expected, expected]),
        (DictSerializer(StrSerializer(), StructSerializer(cls)), {"k": value}, {"k": expected}),
        (OptionalSerializer(StructSerializer(cls)), value, expected),
        (TtlValueSerializer(StructSerializer(cls)), (7, value), [7, expected]),
    ):
        for read in _both_ways(written, shaped):
            assert plain_builtins(read) == want


def _v1_snapshot(cls: Any) -> dict[str, Any]:
    """A record snapshot of the first format: field types as text, the record's own layout
    (map or array) not said."""
    fields = [
        {"name": f.name, "type": repr(f.type), "required": f.required}
        for f in msgspec.inspect.type_info(cls).fields
    ]
    return {"type": "struct", "version": 1, "class": f"gone:{cls.__qualname__}", "fields": fields}


def test_the_earliest_record_snapshots_read_maps_and_arrays() -> None:
    class Point(msgspec.Struct, array_like=True):
        x: int
        y: int = 0

    @dataclasses.dataclass
    class Visit:
        page: str
        n: int = 1

    point = plain_serializer_from_snapshot(_v1_snapshot(Point))
    assert isinstance(point, PlainRecordSerializer)
    read = point.deserialize(StructSerializer(Point).serialize(Point(3)))  # an array
    assert (read.x, read.y) == (3, 0)
    visit = plain_serializer_from_snapshot(_v1_snapshot(Visit))
    read = visit.deserialize(StructSerializer(Visit).serialize(Visit("/a", 2)))  # a map
    assert (read.page, read.n) == ("/a", 2)


def test_pickled_values_stay_their_pickle_streams() -> None:
    written = ListSerializer(PickleSerializer())
    value = [{1, 2}, frozenset("ab")]
    for read in _both_ways(written, value):
        assert all(isinstance(b, bytes) for b in read)
        assert [pickle.loads(b) for b in read] == value
    assert isinstance(plain_serializer_from_snapshot({"type": "pickle"}), PickledBytesSerializer)
    assert describe_schema(readable_schema(written.snapshot())) == "list[bytes]"


def test_builtin_serializers_are_themselves_and_unknown_ones_read_generically() -> None:
    for written in (
        Int64Serializer(),
        TupleSerializer(StrSerializer(), Int64Serializer()),
        OptionalSerializer(StrSerializer()),
    ):
        assert plain_serializer_from_snapshot(written.snapshot()) == written
    unknown = plain_serializer_from_snapshot({"type": "someone-elses", "version": 3})
    assert isinstance(unknown, GenericSerializer)
    assert unknown.deserialize(msgspec.msgpack.encode({"a": [1]})) == {"a": [1]}
    enum_class = plain_serializer_from_snapshot({"type": "struct", "class": "app:Color"})
    assert isinstance(enum_class, GenericSerializer)  # a class without fields: no schema
