"""``deserialize_many`` (a RocksDB key group's values read in one call) against its model: the
values written, and :meth:`deserialize` of each item, for every kind of serializer, the
program's and the plain ones rebuilt from a snapshot; items that are not one value each fail as
:meth:`deserialize` fails on the first of them."""

from __future__ import annotations

import struct
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamstate.serializers import (
    BoolSerializer,
    BytesSerializer,
    DictSerializer,
    Float64Serializer,
    Int64Serializer,
    ListSerializer,
    OptionalSerializer,
    PickleSerializer,
    StrSerializer,
    StructSerializer,
    TtlValueSerializer,
    TupleSerializer,
)
from streamstate.serializers.plain import GenericSerializer, plain_serializer_from_snapshot
from support.record_values import plain_builtins, record_type_and_value

INT64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(max_size=6)
#: lone surrogates too: ``StrSerializer`` writes with ``surrogatepass`` (msgpack does not)
ANY_TEXT = st.text(st.characters(codec=None), max_size=6)

#: (serializer, value strategy)
SERIALIZERS: list[tuple[Any, st.SearchStrategy[Any]]] = [
    (Int64Serializer(), INT64),
    (Float64Serializer(), st.floats(allow_nan=False)),
    (BoolSerializer(), st.booleans()),
    (StrSerializer(), ANY_TEXT),
    (BytesSerializer(), st.binary(max_size=6)),
    (ListSerializer(Int64Serializer()), st.lists(INT64, max_size=3)),
    (DictSerializer(StrSerializer(), Int64Serializer()), st.dictionaries(TEXT, INT64, max_size=3)),
    (OptionalSerializer(Int64Serializer()), st.none() | INT64),
    (TupleSerializer(StrSerializer(), Float64Serializer()), st.tuples(TEXT, st.floats(-9, 9))),
    (TtlValueSerializer(StrSerializer()), st.tuples(INT64, TEXT)),
    (PickleSerializer(), st.lists(st.integers(), max_size=3)),
]


@pytest.mark.parametrize("serializer,values", SERIALIZERS, ids=lambda x: type(x).__name__)
@given(data=st.data())
@settings(max_examples=25, deadline=None)
def test_many_values_read_as_written(serializer: Any, values: Any, data: Any) -> None:
    """Up to 40 items (both sizes of a msgpack array's header), the program's serializer and
    its plain twin (what the state formats read RocksDB entries with)."""
    written = data.draw(st.lists(values, max_size=40))
    items = [serializer.serialize(v) for v in written]
    assert serializer.deserialize_many(items) == written
    plain = plain_serializer_from_snapshot(serializer.snapshot())
    assert plain.deserialize_many(items) == [plain.deserialize(b) for b in items]


@settings(max_examples=40, deadline=None)
@given(drawn=record_type_and_value(), count=st.integers(0, 20))
def test_many_records_read_as_written(drawn: tuple[Any, Any], count: int) -> None:
    """Random record types: the program's serializer gives the values, the plain one (from
    the snapshot alone) the same fields."""
    cls, value = drawn
    serializer = StructSerializer(cls)
    items = [serializer.serialize(value)] * count
    assert serializer.deserialize_many(items) == [value] * count
    plain = plain_serializer_from_snapshot(serializer.snapshot())
    read = plain.deserialize_many(items)
    assert [plain_builtins(r) for r in read] == [
        plain_builtins(plain.deserialize(b)) for b in items
    ]
    generic = GenericSerializer({"type": "unknown"})
    assert generic.deserialize_many(items) == [msgspec.msgpack.decode(b) for b in items]


def test_items_that_are_not_one_value_each_fail_as_deserialize_does() -> None:
    """Concatenated, ``[1, 2]`` and ``[3]`` split elsewhere are the same bytes: the split items
    still fail, like ``deserialize`` of the first one; so do wrong types and widths."""
    lists = ListSerializer(Int64Serializer())
    whole = [lists.serialize([1, 2]), lists.serialize([3])]
    assert lists.deserialize_many(whole) == [[1, 2], [3]]
    joined = b"".join(whole)
    split = [joined[:2], joined[2:]]
    with pytest.raises(msgspec.DecodeError):
        lists.deserialize(split[0])
    with pytest.raises(msgspec.DecodeError):
        lists.deserialize_many(split)
    with pytest.raises(msgspec.ValidationError, match="Expected `int`, got `str`"):
        lists.deserialize_many([lists.serialize([1]), msgspec.msgpack.encode(["x"])])
    ints = Int64Serializer()
    with pytest.raises(struct.error):
        ints.deserialize_many([b"\x00" * 7, b"\x00" * 9])
    assert ints.deserialize_many([]) == []
