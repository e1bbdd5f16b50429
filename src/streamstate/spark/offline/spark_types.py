"""Checkpointed values as Spark columns: the Spark type of a schema, and Arrow arrays of values.

A value's ``TypeSchema`` (``serializers/schema.py``: what the checkpoint says about it)
gives its Spark type; the values a reader decoded without the program's classes
(``serializers/plain.py``) become an Arrow array of that type:

==============================================  ============================================
value                                           Spark type
==============================================  ============================================
``int``, ``float``, ``bool``, ``str``           ``bigint``, ``double``, ``boolean``, ``string``
``bytes``; pickled values                       ``binary`` (a pickle stream is never unpickled)
``T | None``                                    the type of ``T`` (every column is nullable)
``list[T]``, ``set[T]``, ``tuple[T, ...]``      ``array<T>``
``dict[K, V]``                                  ``map<K, V>``
``tuple[A, B]``                                 ``struct<_1: A, _2: B>``
record (dataclass, ``msgspec.Struct``, ...)     ``struct<field: T, ...>``, field by field
``datetime``, ``date``                          ``timestamp``, ``date``
an enum or ``Literal`` of strings (of ints)     ``string`` (``bigint``)
anything else (unions, ``Any``, ``time``,       ``string``: JSON (``time``, ``timedelta``,
``timedelta``, ``Decimal``, ``UUID``, a         ``Decimal`` and ``UUID`` as their ISO / plain
record inside itself, a record without fields)  text; a record without fields as its name)
==============================================  ============================================

>>> from streamstate.serializers.schema import schema_of_type
>>> spark_ddl(schema_of_type(dict[str, list[float] | None]))
'map<string,array<double>>'
"""

from __future__ import annotations

import functools
import operator
import re
from typing import Any

import msgspec
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DateType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from streamstate.serializers.schema import (
    BoolSchema,
    BytesSchema,
    DictSchema,
    EnumSchema,
    FloatSchema,
    IntSchema,
    ListSchema,
    NoneSchema,
    RecordSchema,
    StrSchema,
    TemporalSchema,
    TupleSchema,
    TypeSchema,
    UnionSchema,
)

__all__ = ["arrow_array", "ddl_of", "json_text", "spark_ddl", "spark_type"]

_SCALARS: dict[type, str] = {
    IntSchema: "bigint",
    FloatSchema: "double",
    BoolSchema: "boolean",
    StrSchema: "string",
    BytesSchema: "binary",
}
_TEMPORAL = {"datetime": "timestamp", "date": "date"}


def _nullable_inner(schema: TypeSchema) -> TypeSchema | None:
    """``T`` of a union ``T | None`` (None: not such a union)."""
    if isinstance(schema, UnionSchema):
        others = [t for t in schema.types if not isinstance(t, NoneSchema)]
        if len(others) == 1:
            return others[0]
    return None


def _enum_ddl(schema: EnumSchema) -> str:
    kinds = {type(v) for v in schema.values}
    return "bigint" if kinds == {int} else "string"


def spark_type(schema: TypeSchema) -> Any:
    """The Spark type (a ``pyspark.sql.types.DataType``) of values of ``schema`` (the table in
    the module docstring); every part of it nullable."""
    simple = _SCALARS.get(type(schema))
    if simple is None and isinstance(schema, TemporalSchema):
        simple = _TEMPORAL.get(schema.type, "string")
    if simple is None and isinstance(schema, EnumSchema):
        simple = _enum_ddl(schema)
    if simple is not None:
        return _SIMPLE_TYPES[simple]()
    inner = _nullable_inner(schema)
    if inner is not None:
        return spark_type(inner)
    if isinstance(schema, ListSchema):
        return ArrayType(spark_type(schema.item), containsNull=True)
    if isinstance(schema, DictSchema):
        return MapType(spark_type(schema.key), spark_type(schema.value), valueContainsNull=True)
    if isinstance(schema, TupleSchema) and schema.items:
        return StructType(
            [StructField(f"_{i + 1}", spark_type(t)) for i, t in enumerate(schema.items)]
        )
    if isinstance(schema, RecordSchema) and schema.fields:
        return StructType([StructField(f.name, spark_type(f.type)) for f in schema.fields])
    return StringType()


_SIMPLE_TYPES: dict[str, Any] = {
    "bigint": LongType,
    "double": DoubleType,
    "boolean": BooleanType,
    "string": StringType,
    "binary": BinaryType,
    "timestamp": TimestampType,
    "date": DateType,
}


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _quote(name: str) -> str:
    """A struct field's name as DDL writes it: quoted unless it is a plain identifier."""
    return name if _IDENTIFIER.match(name) else "`" + name.replace("`", "``") + "`"


def ddl_of(data_type: Any) -> str:
    """A Spark type as DDL text (struct field names quoted where they need it).

    >>> ddl_of(MapType(StringType(), StructType([StructField("end", LongType())])))
    'map<string,struct<end:bigint>>'
    >>> ddl_of(StructType([StructField("first name", LongType())]))
    'struct<`first name`:bigint>'
    """
    if isinstance(data_type, StructType):
        return (
            "struct<" + ",".join(f"{_quote(f.name)}:{ddl_of(f.dataType)}" for f in data_type) + ">"
        )
    if isinstance(data_type, ArrayType):
        return f"array<{ddl_of(data_type.elementType)}>"
    if isinstance(data_type, MapType):
        return f"map<{ddl_of(data_type.keyType)},{ddl_of(data_type.valueType)}>"
    return str(data_type.simpleString())


def spark_ddl(schema: TypeSchema) -> str:
    """The Spark type of values of ``schema`` as DDL text.

    >>> from streamstate.serializers.schema import FieldSchema
    >>> spark_ddl(RecordSchema("TimeWindow", (FieldSchema("start", IntSchema()),
    ...                                       FieldSchema("end", IntSchema()))))
    'struct<start:bigint,end:bigint>'
    """
    return ddl_of(spark_type(schema))


# ---- values as Arrow arrays ---------------------------------------------------------------------


def json_text(value: Any) -> str | None:
    """A value as JSON (None stays None): records by field, bytes as hex, sets as sorted lists,
    windows as ``{"start": ..., "end": ...}``.

    >>> json_text({"a": [1, 2.5, None]}), json_text(None)
    ('{"a":[1,2.5,null]}', None)
    """
    if value is None:
        return None
    try:
        return msgspec.json.encode(value, enc_hook=_enc_hook).decode()
    except (TypeError, msgspec.EncodeError):
        return repr(value)


def _enc_hook(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    if hasattr(value, "_asdict"):  # a record read in its array form (a named tuple)
        return value._asdict()
    raise TypeError(f"cannot encode {type(value).__name__}")


def _text(value: Any) -> str | None:
    if value is None:
        return None
    iso = getattr(value, "isoformat", None)
    return str(iso()) if iso is not None else str(value)


def arrow_array(values: list[Any], schema: TypeSchema, arrow_type: Any) -> Any:
    """The Arrow array of ``arrow_type`` (the Arrow form of :func:`spark_ddl` of ``schema``)
    holding ``values``, which a plain serializer decoded (None: a null). Containers of scalars
    are converted by Arrow in one call; records and tuples column by column."""
    import pyarrow as pa

    if type(schema) in _SCALARS:
        return pa.array(values, arrow_type)
    inner = _nullable_inner(schema)
    if inner is not None:
        return arrow_array(values, inner, arrow_type)
    if isinstance(schema, RecordSchema) and not schema.fields:
        return pa.array([None if v is None else schema.name for v in values], arrow_type)
    if isinstance(schema, EnumSchema) and len({type(v) for v in schema.values}) == 1:
        return pa.array(values, arrow_type)
    if _as_text(schema):
        convert = _text if isinstance(schema, TemporalSchema) else json_text
        return pa.array([convert(v) for v in values], arrow_type)
    if isinstance(schema, ListSchema):
        return _list_array(values, schema.item, arrow_type)
    if isinstance(schema, DictSchema):
        return _map_array(values, schema, arrow_type)
    if isinstance(schema, TupleSchema):
        by_index: list[Any] = [operator.itemgetter(i) for i in range(len(schema.items))]
        return _struct_array(values, list(schema.items), by_index, arrow_type)
    if isinstance(schema, RecordSchema):
        by_name: list[Any] = [operator.attrgetter(f.name) for f in schema.fields]
        return _struct_array(values, [f.type for f in schema.fields], by_name, arrow_type)
    return pa.array(values, arrow_type)  # temporal types, enums


@functools.lru_cache(maxsize=256)
def _as_text(schema: TypeSchema) -> bool:
    """Whether values of ``schema`` are a string column of their text (JSON, ISO)."""
    return isinstance(spark_type(schema), StringType) and not isinstance(schema, StrSchema)


def _is_flat(schema: TypeSchema) -> bool:
    """Whether Arrow converts values of ``schema`` by itself (scalars, maybe None)."""
    inner = _nullable_inner(schema)
    return type(inner if inner is not None else schema) in _SCALARS


def _offsets(values: list[Any]) -> tuple[list[int], list[bool] | None]:
    offsets, mask, at = [0], [], 0
    for v in values:
        at += 0 if v is None else len(v)
        offsets.append(at)
        mask.append(v is None)
    return offsets, (mask if any(mask) else None)


def _list_array(values: list[Any], item: TypeSchema, arrow_type: Any) -> Any:
    import pyarrow as pa

    if _is_flat(item):
        return pa.array([None if v is None else list(v) for v in values], arrow_type)
    offsets, mask = _offsets(values)
    flat = [x for v in values if v is not None for x in v]
    child = arrow_array(flat, item, arrow_type.value_type)
    return pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()), child, type=arrow_type, mask=_mask(mask)
    )


def _map_array(values: list[Any], schema: DictSchema, arrow_type: Any) -> Any:
    import pyarrow as pa

    if _is_flat(schema.key) and _is_flat(schema.value):
        return pa.array([None if v is None else list(v.items()) for v in values], arrow_type)
    offsets, mask = _offsets(values)
    keys = [k for v in values if v is not None for k in v]
    items = [x for v in values if v is not None for x in v.values()]
    return pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()),
        arrow_array(keys, schema.key, arrow_type.key_type),
        arrow_array(items, schema.value, arrow_type.item_type),
        type=arrow_type,
        mask=_mask(mask),
    )


def _struct_array(
    values: list[Any], fields: list[TypeSchema], getters: list[Any], arrow_type: Any
) -> Any:
    import pyarrow as pa

    nulls = values.count(None)
    mask = [v is None for v in values] if nulls else None
    children = []
    for i, (field, get) in enumerate(zip(fields, getters, strict=True)):
        column = (
            list(map(get, values)) if not nulls else [None if v is None else get(v) for v in values]
        )
        children.append(arrow_array(column, field, arrow_type.field(i).type))
    return pa.StructArray.from_arrays(children, fields=list(arrow_type), mask=_mask(mask))


def _mask(mask: list[bool] | None) -> Any:
    import pyarrow as pa

    return None if mask is None else pa.array(mask, pa.bool_())
