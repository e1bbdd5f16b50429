"""The schema of a serializer snapshot, and values decoded from a schema alone.

:func:`schema_of_snapshot` describes the values of any serializer snapshot a checkpoint holds:
built-in serializers, window namespaces, record serializers whose snapshot carries a ``"schema"``,
and the earlier record snapshots (:mod:`~streamstate.serializers.schema_text`). From a schema,
:func:`decoder_type` builds a type that ``msgspec`` decodes the same msgpack bytes into (records
become :class:`PlainRecord` structs carrying the field names), so a reader of a checkpoint never
needs to import, or run, the code that wrote it.

>>> import dataclasses, msgspec
>>> from streamstate.serializers.schema import schema_of_type
>>> @dataclasses.dataclass
... class Visit:
...     page: str
...     clicks: int = 0
>>> plain = msgspec.msgpack.decode(msgspec.msgpack.encode(Visit("/a", 3)),
...                                type=decoder_type(schema_of_type(Visit)))
>>> plain.page, plain.clicks
('/a', 3)
"""

from __future__ import annotations

import datetime
import decimal
import uuid
from collections.abc import Callable
from typing import Any, Literal, Union

import msgspec

from streamstate.errors import SerializerSnapshotError
from streamstate.serializers.schema import (
    AnySchema,
    BoolSchema,
    BytesSchema,
    DictSchema,
    EnumSchema,
    FieldSchema,
    FloatSchema,
    IntSchema,
    ListSchema,
    NoneSchema,
    RecordSchema,
    RefSchema,
    StrSchema,
    TemporalSchema,
    TupleSchema,
    TypeSchema,
    UnionSchema,
    schema_from_builtins,
)
from streamstate.serializers.schema_text import record_schema_of_v1_fields

__all__ = ["PlainRecord", "decoder_type", "schema_of_snapshot"]


_SNAPSHOT_SCALARS: dict[str, TypeSchema] = {
    "int64": IntSchema(),
    "float64": FloatSchema(),
    "bool": BoolSchema(),
    "str": StrSchema(),
    "bytes": BytesSchema(),
    "void_namespace": NoneSchema(),
}
_TIME_WINDOW = RecordSchema(
    "TimeWindow", (FieldSchema("start", IntSchema()), FieldSchema("end", IntSchema())), True
)
_GLOBAL_WINDOW = RecordSchema("GlobalWindow", (), True)


def schema_of_snapshot(
    snap: Any,
    unknown: Callable[[Any], TypeSchema | None] | None = None,
    *,
    v1_records: set[int] | None = None,
) -> TypeSchema | None:
    """The schema of the values a serializer snapshot describes, or None when the snapshot
    gives none (pickled values, an unknown serializer, a record type whose earlier snapshot
    cannot be read). A ``ttl_value`` is its stored pair ``(last access, value)``.
    ``v1_records`` (if given) receives the ids of the record schemas read from version-1
    snapshot text, whose own layout (array-like, tag, wire names) that text did not keep.

    ``unknown``, when given, is asked for the schema of each such part instead (a snapshot
    nested in a list, a dict, ...), so that the rest of the schema is still described.

    >>> schema_of_snapshot({"type": "optional", "inner": {"type": "int64"}})
    UnionSchema(types=(IntSchema(), NoneSchema()))
    >>> schema_of_snapshot({"type": "pickle"}) is None
    True
    >>> schema_of_snapshot({"type": "list", "element": {"type": "pickle"}},
    ...                    unknown=lambda snap: BytesSchema())
    ListSchema(item=BytesSchema(), container='list')
    """
    schema = _described(snap, unknown, v1_records)
    if schema is None and unknown is not None:
        return unknown(snap)
    return schema


def _described(
    snap: Any,
    unknown: Callable[[Any], TypeSchema | None] | None,
    v1_records: set[int] | None,
) -> TypeSchema | None:
    if not isinstance(snap, dict):
        return None
    t = snap.get("type")
    if isinstance(t, str) and t in _SNAPSHOT_SCALARS:
        return _SNAPSHOT_SCALARS[t]
    if t == "time_window":
        return _TIME_WINDOW
    if t == "global_window":
        return _GLOBAL_WINDOW
    parts: list[TypeSchema | None]
    if t == "optional":
        parts = [schema_of_snapshot(snap.get("inner"), unknown, v1_records=v1_records)]
        return None if parts[0] is None else UnionSchema((parts[0], NoneSchema()))
    if t == "list":
        item = schema_of_snapshot(snap.get("element"), unknown, v1_records=v1_records)
        return None if item is None else ListSchema(item)
    if t == "dict":
        key = schema_of_snapshot(snap.get("key"), unknown, v1_records=v1_records)
        value = schema_of_snapshot(snap.get("value"), unknown, v1_records=v1_records)
        return None if key is None or value is None else DictSchema(key, value)
    if t in ("tuple", "ttl_value"):
        subs = snap.get("fields", ()) if t == "tuple" else ({"type": "int64"}, snap.get("inner"))
        if not isinstance(subs, list | tuple):
            return None
        parts = [schema_of_snapshot(s, unknown, v1_records=v1_records) for s in subs]
        if any(p is None for p in parts):
            return None
        return TupleSchema(tuple(p for p in parts if p is not None))
    if t == "struct":
        return _schema_of_struct_snapshot(snap, v1_records)
    return None


def _schema_of_struct_snapshot(
    snap: dict[str, Any], v1_records: set[int] | None
) -> TypeSchema | None:
    if "schema" in snap:
        try:
            return schema_from_builtins(snap["schema"])
        except msgspec.ValidationError:
            return None
    qual = str(snap.get("class", "")).partition(":")[2]
    name = qual.rsplit(".", 1)[-1] or "record"
    if "fields" not in snap:
        return _STDLIB_CLASSES.get(str(snap.get("class", "")))
    try:
        schema = record_schema_of_v1_fields(name, snap["fields"])
    except ValueError:
        return None
    if v1_records is not None:
        v1_records.add(id(schema))
    return schema


_STDLIB_CLASSES: dict[str, TypeSchema] = {
    "datetime:datetime": TemporalSchema("datetime"),
    "datetime:date": TemporalSchema("date"),
    "datetime:time": TemporalSchema("time"),
    "datetime:timedelta": TemporalSchema("timedelta"),
    "decimal:Decimal": TemporalSchema("decimal"),
    "uuid:UUID": TemporalSchema("uuid"),
}


class PlainRecord(msgspec.Struct, frozen=True, gc=False):
    """The base of the record structs :func:`decoder_type` builds: field names as attributes,
    in the schema's order (``msgspec.structs.asdict`` gives a dict)."""


_TEMPORAL_TYPES: dict[str, type] = {
    "datetime": datetime.datetime,
    "date": datetime.date,
    "time": datetime.time,
    "timedelta": datetime.timedelta,
    "decimal": decimal.Decimal,
    "uuid": uuid.UUID,
}


def decoder_type(schema: TypeSchema) -> Any:
    """A type hint ``msgspec`` decodes values of ``schema`` into, built without the classes
    that wrote them: records become :class:`PlainRecord` structs of the same field and wire
    names (fields the data may omit default to None), enums and literals their encoded values.
    A schema no type can be built from (a checkpoint is input: names that are not identifiers,
    a union of nothing) raises :class:`~streamstate.errors.SerializerSnapshotError`.
    """
    try:
        return _decoder_type(schema)
    except (TypeError, ValueError) as exc:
        raise SerializerSnapshotError(
            f"no type decodes the values of the schema {schema!r:.200}: {exc}"
        ) from None


def _decoder_type(schema: TypeSchema) -> Any:
    simple: dict[type, Any] = {
        AnySchema: Any,
        NoneSchema: None,
        BoolSchema: bool,
        IntSchema: int,
        FloatSchema: float,
        StrSchema: str,
        BytesSchema: bytes,
        # a record inside itself: its values decode as plain msgpack (dicts, lists)
        RefSchema: Any,
    }
    if type(schema) in simple:
        return simple[type(schema)]
    if isinstance(schema, TemporalSchema):
        return _TEMPORAL_TYPES.get(schema.type, Any)
    if isinstance(schema, EnumSchema):
        return Literal[schema.values] if schema.values else Any  # type: ignore[valid-type]
    if isinstance(schema, ListSchema):
        item = _decoder_type(schema.item)
        return tuple[item, ...] if schema.container == "tuple" else list[item]  # type: ignore[valid-type]
    if isinstance(schema, TupleSchema):
        items = tuple(_decoder_type(s) for s in schema.items)
        return tuple[items] if items else tuple[()]  # type: ignore[valid-type]
    if isinstance(schema, DictSchema):
        return dict[_decoder_type(schema.key), _decoder_type(schema.value)]  # type: ignore[misc]
    if isinstance(schema, UnionSchema):
        return Union[tuple(_decoder_type(s) for s in schema.types)]  # noqa: UP007
    assert isinstance(schema, RecordSchema)
    fields: list[Any] = []
    for f in schema.fields:
        tp = _decoder_type(f.type)
        fields.append((f.name, tp) if f.required else (f.name, tp | None, None))  # type: ignore[operator]
    return msgspec.defstruct(
        schema.name,
        fields,
        bases=(PlainRecord,),
        array_like=schema.array_like,
        tag_field=schema.tag_field or None,
        tag=schema.tag if schema.tag_field else None,
        rename={f.name: f.wire_name for f in schema.fields if f.encode_name} or None,
        frozen=True,
        gc=False,
        # a field the data must hold may follow one it may omit (a keyword-only record's)
        kw_only=True,
    )
