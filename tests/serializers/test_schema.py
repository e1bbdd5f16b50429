"""Record schemas: described from types, stored as builtins, read back from snapshots of both
formats, and values decoded from a schema alone equal to what the class encoded."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import uuid
from typing import Any, Literal, NamedTuple, TypedDict

import msgspec
import pytest
from hypothesis import given, settings

from streamstate.serializers import StructSerializer, serializer_for
from streamstate.serializers.schema import (
    AnySchema,
    EnumSchema,
    ListSchema,
    RecordSchema,
    TupleSchema,
    UnionSchema,
    describe_schema,
    schema_from_builtins,
    schema_of_type,
    schema_to_builtins,
)
from streamstate.serializers.schema_text import record_schema_of_v1_fields
from streamstate.serializers.snapshot_schema import decoder_type, schema_of_snapshot
from support.record_values import expected_builtins, plain_builtins, record_type_and_value


class Color(enum.Enum):
    RED = 1
    GREEN = 2


@dataclasses.dataclass
class Inner:
    a: int
    b: list[float] = dataclasses.field(default_factory=list)


class Point(msgspec.Struct, array_like=True):
    x: int
    y: int = 0


class Tagged(msgspec.Struct, tag=True):
    n: int


class Renamed(msgspec.Struct, rename="camel"):
    first_name: str
    last_seen: datetime.datetime | None = None


class Pair(NamedTuple):
    left: str
    right: int


class Doc(TypedDict):
    title: str
    pages: int


class Everything(msgspec.Struct):
    i: int
    f: float
    s: str
    raw: bytes
    flag: bool
    maybe: str | None
    inner: Inner
    inners: dict[str, Inner]
    point: Point
    tagged: Tagged
    renamed: Renamed
    pair: Pair
    doc: Doc
    color: Color
    mode: Literal["a", "b"]
    fixed: tuple[int, str]
    var: tuple[int, ...]
    tags: frozenset[str]
    when: datetime.datetime
    day: datetime.date
    span: datetime.timedelta
    clock: datetime.time
    price: decimal.Decimal
    ident: uuid.UUID
    anything: Any


EVERYTHING = Everything(
    i=-3,
    f=1.5,
    s="s",
    raw=b"\x00\xff",
    flag=True,
    maybe=None,
    inner=Inner(1, [2.5]),
    inners={"k": Inner(2)},
    point=Point(3, 4),
    tagged=Tagged(5),
    renamed=Renamed("ann", datetime.datetime(2024, 1, 2, 3, 4, 5)),
    pair=Pair("l", 6),
    doc={"title": "t", "pages": 7},
    color=Color.GREEN,
    mode="b",
    fixed=(8, "x"),
    var=(9, 10),
    tags=frozenset({"only"}),
    when=datetime.datetime(2025, 5, 6, 7, 8, 9, tzinfo=datetime.UTC),
    day=datetime.date(2025, 5, 6),
    span=datetime.timedelta(seconds=90),
    clock=datetime.time(1, 2, 3),
    price=decimal.Decimal("12.50"),
    ident=uuid.UUID(int=42),
    anything={"free": [1, "form"]},
)


def _decode_plain(cls: Any, value: Any) -> Any:
    data = StructSerializer(cls).serialize(value)
    return msgspec.msgpack.decode(data, type=decoder_type(schema_of_type(cls)))


def test_every_record_kind_decodes_from_its_schema_alone() -> None:
    decoded = _decode_plain(Everything, EVERYTHING)
    plain = plain_builtins(decoded)
    expected = expected_builtins(EVERYTHING)
    assert plain == expected
    assert isinstance(decoded.when, datetime.datetime)
    assert isinstance(decoded.price, decimal.Decimal)
    assert isinstance(decoded.ident, uuid.UUID)


def test_schema_survives_builtins_and_json() -> None:
    schema = schema_of_type(Everything)
    stored = msgspec.json.decode(msgspec.json.encode(schema_to_builtins(schema)))
    assert schema_from_builtins(stored) == schema


def test_schema_is_judged_by_fields_not_by_qualified_name() -> None:
    @dataclasses.dataclass
    class Inner:  # same name and fields as the module's, defined elsewhere
        a: int
        b: list[float] = dataclasses.field(default_factory=list)

    assert schema_of_type(Inner) == schema_of_type(globals()["Inner"])


def test_record_details_are_kept() -> None:
    schema = schema_of_type(Everything)
    assert isinstance(schema, RecordSchema)
    by_name = {f.name: f for f in schema.fields}
    assert by_name["point"].type == schema_of_type(Point)
    point = schema_of_type(Point)
    assert isinstance(point, RecordSchema) and point.array_like
    tagged = schema_of_type(Tagged)
    assert isinstance(tagged, RecordSchema) and (tagged.tag_field, tagged.tag) == ("type", "Tagged")
    renamed = schema_of_type(Renamed)
    assert isinstance(renamed, RecordSchema)
    assert [f.wire_name for f in renamed.fields] == ["firstName", "lastSeen"]
    assert by_name["color"].type == EnumSchema((1, 2), "Color")
    assert by_name["var"].type == ListSchema(schema_of_type(int), "tuple")
    assert [f.required for f in schema_of_type(Inner).fields] == [True, False]  # type: ignore[union-attr]


@dataclasses.dataclass
class Node:
    value: int
    children: list[Node] = dataclasses.field(default_factory=list)


def test_self_referencing_record() -> None:
    schema = schema_of_type(Node)
    assert describe_schema(schema) == "Node{value: int, children: list[Node]}"
    decoded = msgspec.msgpack.decode(
        msgspec.msgpack.encode(Node(1, [Node(2)])), type=decoder_type(schema)
    )
    assert decoded.value == 1 and decoded.children == [{"value": 2, "children": []}]


def test_schema_of_builtin_snapshots() -> None:
    snap = serializer_for(dict[str, list[tuple[int, float | None]]]).snapshot()
    assert describe_schema(schema_of_snapshot(snap)) == "dict[str, list[tuple[int, float | None]]]"
    assert schema_of_snapshot({"type": "pickle"}) is None
    assert schema_of_snapshot({"type": "no such serializer"}) is None
    ttl = schema_of_snapshot({"type": "ttl_value", "inner": {"type": "str"}})
    assert ttl == TupleSchema((schema_of_type(int), schema_of_type(str)))


def test_record_snapshot_with_a_stored_schema() -> None:
    snap = {"type": "struct", "version": 2, "schema": schema_to_builtins(schema_of_type(Inner))}
    assert schema_of_snapshot(snap) == schema_of_type(Inner)
    assert schema_of_snapshot({"type": "struct", "schema": {"kind": "nonsense"}}) is None


def _without_enum_values(schema: Any) -> Any:
    """What a version-1 snapshot keeps: enums read any value."""
    if isinstance(schema, EnumSchema):
        return AnySchema()
    if isinstance(schema, RecordSchema):
        fields = tuple(
            msgspec.structs.replace(f, type=_without_enum_values(f.type)) for f in schema.fields
        )
        return msgspec.structs.replace(schema, fields=fields)
    if isinstance(schema, ListSchema):
        return msgspec.structs.replace(schema, item=_without_enum_values(schema.item))
    if isinstance(schema, UnionSchema | TupleSchema):
        attr = "types" if isinstance(schema, UnionSchema) else "items"
        subs = tuple(_without_enum_values(s) for s in getattr(schema, attr))
        return msgspec.structs.replace(schema, **{attr: subs})
    return schema


@pytest.mark.parametrize("cls", [Everything, Inner, Renamed, Pair])
def test_version_1_record_snapshots_are_read_from_their_text(cls: Any) -> None:
    v1 = {"type": "struct", "version": 1, "class": f"{__name__}:{cls.__qualname__}"}
    v1["fields"] = [
        {"name": f.name, "type": repr(f.type), "required": f.required}
        for f in msgspec.inspect.type_info(cls).fields
    ]
    from_text = schema_of_snapshot(v1)
    expected = _without_enum_values(schema_of_type(cls))
    # the text does not give the layout of the record itself (array-like, tag, its fields' wire
    # names); it does give those of nested records
    top_fields = tuple(msgspec.structs.replace(f, encode_name="") for f in expected.fields)
    assert from_text == msgspec.structs.replace(
        expected, array_like=False, tag_field="", tag=None, fields=top_fields
    )


def test_unreadable_version_1_text_gives_no_schema() -> None:
    for text in ("IntType(", "eval('x')", "UnknownType()", "StructType(cls=<class 'x'", "1 + 1"):
        snap = {"type": "struct", "class": "m:X", "fields": [{"name": "a", "type": text}]}
        assert schema_of_snapshot(snap) is None
    with pytest.raises(ValueError):
        record_schema_of_v1_fields("X", [{"name": "a"}])


@settings(max_examples=80, deadline=None)
@given(record_type_and_value())
def test_random_records_decode_from_schema_and_from_version_1_text(drawn: tuple[Any, Any]) -> None:
    cls, value = drawn
    expected = expected_builtins(value)
    assert plain_builtins(_decode_plain(cls, value)) == expected
    v1 = {"type": "struct", "version": 1, "class": f"types:{cls.__qualname__}"}
    v1["fields"] = [
        {"name": f.name, "type": repr(f.type), "required": f.required}
        for f in msgspec.inspect.type_info(cls).fields
    ]
    schema = schema_of_snapshot(v1)
    assert schema is not None
    data = StructSerializer(cls).serialize(value)
    assert plain_builtins(msgspec.msgpack.decode(data, type=decoder_type(schema))) == expected
