"""What a value's type looks like, as data: the schema a checkpoint keeps of its record types.

A record type (dataclass, ``msgspec.Struct``, named tuple, typed dict) is described field by field,
recursively, by a :data:`TypeSchema`: a small tree of msgspec structs that encodes to JSON-able
builtins (:func:`schema_to_builtins`) and back (:func:`schema_from_builtins`), so that a serializer
snapshot can carry it. A record's schema names the class by its short name only: a class renamed
or moved to another module with the same fields has the same fields in its schema.

:mod:`streamstate.serializers.snapshot_schema` gives the schema of any serializer snapshot and
decodes values from a schema alone, without the program's classes.

>>> import dataclasses
>>> @dataclasses.dataclass
... class Visit:
...     page: str
...     clicks: int = 0
>>> describe_schema(schema_of_type(Visit))
'Visit{page: str, clicks: int}'
>>> schema_from_builtins(schema_to_builtins(schema_of_type(Visit))) == schema_of_type(Visit)
True
"""

from __future__ import annotations

from typing import Any, Union

import msgspec
import msgspec.inspect as mi

__all__ = [
    "AnySchema",
    "BoolSchema",
    "BytesSchema",
    "DictSchema",
    "EnumSchema",
    "FieldSchema",
    "FloatSchema",
    "IntSchema",
    "ListSchema",
    "NoneSchema",
    "RecordSchema",
    "RefSchema",
    "StrSchema",
    "TemporalSchema",
    "TupleSchema",
    "TypeSchema",
    "UnionSchema",
    "describe_schema",
    "schema_from_builtins",
    "schema_of_type",
    "schema_to_builtins",
]


class _Schema(msgspec.Struct, frozen=True, tag_field="kind", omit_defaults=True):
    pass


class AnySchema(_Schema, frozen=True, tag="any"):
    """Any msgpack value (an unannotated field, ``typing.Any``)."""


class NoneSchema(_Schema, frozen=True, tag="none"):
    """``None``."""


class BoolSchema(_Schema, frozen=True, tag="bool"):
    """``bool``."""


class IntSchema(_Schema, frozen=True, tag="int"):
    """``int`` (64-bit signed on the wire)."""


class FloatSchema(_Schema, frozen=True, tag="float"):
    """``float``."""


class StrSchema(_Schema, frozen=True, tag="str"):
    """``str``."""


class BytesSchema(_Schema, frozen=True, tag="bytes"):
    """``bytes``, ``bytearray`` or ``memoryview``."""


class TemporalSchema(_Schema, frozen=True, tag="scalar"):
    """A standard-library scalar msgspec encodes as a string or an extension: ``type`` is one of
    ``datetime``, ``date``, ``time``, ``timedelta``, ``decimal``, ``uuid``."""

    type: str


class EnumSchema(_Schema, frozen=True, tag="enum"):
    """An ``enum.Enum`` or ``Literal``: its values as they are encoded (``name`` empty for a
    ``Literal``)."""

    values: tuple[Any, ...]
    name: str = ""


class ListSchema(_Schema, frozen=True, tag="list"):
    """A variable-length sequence: ``list``, ``set``, ``frozenset`` or ``tuple[T, ...]``
    (``container``)."""

    item: TypeSchema
    container: str = "list"


class TupleSchema(_Schema, frozen=True, tag="tuple"):
    """A fixed-length ``tuple[A, B, ...]``."""

    items: tuple[TypeSchema, ...]


class DictSchema(_Schema, frozen=True, tag="dict"):
    """``dict[K, V]``."""

    key: TypeSchema
    value: TypeSchema


class UnionSchema(_Schema, frozen=True, tag="union"):
    """``A | B | ...`` (``T | None`` is a union with :class:`NoneSchema`)."""

    types: tuple[TypeSchema, ...]


class FieldSchema(msgspec.Struct, frozen=True, omit_defaults=True):
    """One field of a record: its name in Python, its name on the wire (``rename``), its type,
    and whether data must carry it (a field without a default)."""

    name: str
    type: TypeSchema
    required: bool = True
    encode_name: str = ""

    @property
    def wire_name(self) -> str:
        return self.encode_name or self.name


class RecordSchema(_Schema, frozen=True, tag="record"):
    """A record type: dataclass, ``msgspec.Struct``, named tuple or typed dict. ``name`` is the
    class's name (its qualified name is not part of its schema: a renamed or moved class with
    the same fields has the same schema); ``array_like`` records are msgpack arrays in field
    order, the others maps keyed by wire name, with ``tag_field: tag`` when tagged."""

    name: str
    fields: tuple[FieldSchema, ...]
    array_like: bool = False
    tag_field: str = ""
    tag: Any = None


class RefSchema(_Schema, frozen=True, tag="ref"):
    """A record type that contains itself: a reference to the enclosing record named ``name``."""

    name: str


TypeSchema = Union[  # noqa: UP007 - a runtime union msgspec decodes by tag
    AnySchema,
    NoneSchema,
    BoolSchema,
    IntSchema,
    FloatSchema,
    StrSchema,
    BytesSchema,
    TemporalSchema,
    EnumSchema,
    ListSchema,
    TupleSchema,
    DictSchema,
    UnionSchema,
    RecordSchema,
    RefSchema,
]
"""The schema of one type: one of the ``*Schema`` structs of this module."""


def schema_to_builtins(schema: TypeSchema) -> dict[str, Any]:
    """The schema as JSON-able builtins (what a serializer snapshot stores).

    >>> schema_to_builtins(ListSchema(IntSchema()))
    {'kind': 'list', 'item': {'kind': 'int'}}
    """
    # through JSON: lists, not tuples, so that a snapshot equals itself read back from a file
    out = msgspec.json.decode(msgspec.json.encode(schema))
    assert isinstance(out, dict)
    return out


def schema_from_builtins(data: Any) -> TypeSchema:
    """The schema stored as builtins; ``msgspec.ValidationError`` if ``data`` is not one."""
    return msgspec.convert(data, TypeSchema)  # type: ignore[arg-type]


# -- from a Python type -------------------------------------------------------------------------

_TEMPORAL_INFO: dict[type, str] = {
    mi.DateTimeType: "datetime",
    mi.DateType: "date",
    mi.TimeType: "time",
    mi.TimeDeltaType: "timedelta",
    mi.DecimalType: "decimal",
    mi.UUIDType: "uuid",
}
_SIMPLE_INFO: dict[type, TypeSchema] = {
    mi.AnyType: AnySchema(),
    mi.NoneType: NoneSchema(),
    mi.BoolType: BoolSchema(),
    mi.IntType: IntSchema(),
    mi.FloatType: FloatSchema(),
    mi.StrType: StrSchema(),
    mi.BytesType: BytesSchema(),
    mi.ByteArrayType: BytesSchema(),
    mi.MemoryViewType: BytesSchema(),
}
_CONTAINERS: dict[type, str] = {
    mi.ListType: "list",
    mi.SetType: "set",
    mi.FrozenSetType: "frozenset",
    mi.VarTupleType: "tuple",
}


def schema_of_type(tp: Any) -> TypeSchema:
    """The schema of the Python type hint ``tp``; ``TypeError`` for a type msgspec cannot
    encode on its own.

    >>> describe_schema(schema_of_type(dict[str, list[float] | None]))
    'dict[str, list[float] | None]'
    """
    try:
        info = mi.type_info(tp)
    except TypeError as exc:
        raise TypeError(f"{tp!r} has no schema: {exc}") from None
    return _schema_of_info(info, ())


def _schema_of_info(info: Any, enclosing: tuple[int, ...]) -> TypeSchema:
    if isinstance(info, mi.Metadata):
        return _schema_of_info(info.type, enclosing)
    simple = _SIMPLE_INFO.get(type(info))
    if simple is not None:
        return simple
    if type(info) in _TEMPORAL_INFO:
        return TemporalSchema(_TEMPORAL_INFO[type(info)])
    if isinstance(info, mi.EnumType):
        return EnumSchema(tuple(m.value for m in info.cls), info.cls.__name__)
    if isinstance(info, mi.LiteralType):
        return EnumSchema(tuple(info.values))
    if type(info) in _CONTAINERS:
        return ListSchema(_schema_of_info(info.item_type, enclosing), _CONTAINERS[type(info)])
    if isinstance(info, mi.TupleType):
        return TupleSchema(tuple(_schema_of_info(t, enclosing) for t in info.item_types))
    if isinstance(info, mi.DictType | mi.FrozenDictType):
        key = _schema_of_info(info.key_type, enclosing)
        return DictSchema(key, _schema_of_info(info.value_type, enclosing))
    if isinstance(info, mi.UnionType):
        return UnionSchema(tuple(_schema_of_info(t, enclosing) for t in info.types))
    if isinstance(info, mi.StructType | mi.DataclassType | mi.NamedTupleType | mi.TypedDictType):
        return _record_of_info(info, enclosing)
    raise TypeError(f"{info!r} has no schema (not a type msgspec encodes on its own)")


def _record_of_info(info: Any, enclosing: tuple[int, ...]) -> TypeSchema:
    name = getattr(info.cls, "__name__", "record")
    if id(info.cls) in enclosing:
        return RefSchema(name)
    inner = (*enclosing, id(info.cls))
    fields = tuple(
        FieldSchema(
            f.name,
            _schema_of_info(f.type, inner),
            bool(f.required),
            f.encode_name if f.encode_name != f.name else "",
        )
        for f in info.fields
    )
    if isinstance(info, mi.StructType):
        return RecordSchema(name, fields, bool(info.array_like), info.tag_field or "", info.tag)
    return RecordSchema(name, fields, array_like=isinstance(info, mi.NamedTupleType))


# -- in the user's words ------------------------------------------------------------------------


def describe_schema(schema: TypeSchema | None) -> str:
    """The schema in the words of Python type hints, records with their fields.

    >>> describe_schema(UnionSchema((TemporalSchema("datetime"), NoneSchema())))
    'datetime | None'
    >>> describe_schema(RecordSchema("Acc", (FieldSchema("n", IntSchema()),)))
    'Acc{n: int}'
    """
    if schema is None:
        return "an unknown type"
    words = {
        AnySchema: "Any",
        NoneSchema: "None",
        BoolSchema: "bool",
        IntSchema: "int",
        FloatSchema: "float",
        StrSchema: "str",
        BytesSchema: "bytes",
    }
    if type(schema) in words:
        return words[type(schema)]
    if isinstance(schema, TemporalSchema):
        return {"decimal": "Decimal", "uuid": "UUID"}.get(schema.type, schema.type)
    if isinstance(schema, EnumSchema):
        return schema.name or f"Literal[{', '.join(map(repr, schema.values))}]"
    if isinstance(schema, ListSchema):
        inner = describe_schema(schema.item)
        return (
            f"tuple[{inner}, ...]"
            if schema.container == "tuple"
            else f"{schema.container}[{inner}]"
        )
    if isinstance(schema, TupleSchema):
        return f"tuple[{', '.join(describe_schema(s) for s in schema.items)}]"
    if isinstance(schema, DictSchema):
        return f"dict[{describe_schema(schema.key)}, {describe_schema(schema.value)}]"
    if isinstance(schema, UnionSchema):
        return " | ".join(describe_schema(s) for s in schema.types)
    if isinstance(schema, RefSchema):
        return schema.name
    assert isinstance(schema, RecordSchema)
    fields = ", ".join(f"{f.name}: {describe_schema(f.type)}" for f in schema.fields)
    return f"{schema.name}{{{fields}}}"
