"""Serializers rebuilt from a checkpoint's snapshots alone, for readers of a checkpoint.

:func:`~streamstate.serializers.serializer_from_snapshot` rebuilds the serializers a job declared,
which for a record type means finding its class in the program. A reader of a checkpoint (the
state data source, the CLI) has no such program: :func:`plain_serializer_from_snapshot` rebuilds
every serializer from what the snapshot itself says, and never imports or runs anything a
checkpoint names:

* built-in serializers (scalars, containers, TTL pairs, window namespaces) are themselves;
* a record type (``struct``) reads its values into :class:`~streamstate.serializers.
  snapshot_schema.PlainRecord` structs of its schema (:class:`PlainRecordSerializer`);
* pickled values stay the bytes of their pickle stream (:class:`PickledBytesSerializer`): nothing
  is unpickled;
* a serializer this version does not know, and a record type whose snapshot gives no schema,
  read their values as plain msgpack (:class:`GenericSerializer`).

The bytes each one reads are exactly the bytes the original wrote, in both encodings a checkpoint
holds: the wire values of a canonical snapshot file (``wire_type``, ``from_wire``) and the bytes of
a RocksDB entry (``deserialize``).

>>> import dataclasses
>>> from streamstate.serializers import ListSerializer, StructSerializer
>>> @dataclasses.dataclass
... class Visit:
...     page: str
...     clicks: int = 0
>>> written = ListSerializer(StructSerializer(Visit))
>>> plain = plain_serializer_from_snapshot(written.snapshot())
>>> [v.page for v in plain.deserialize(written.serialize([Visit("/a", 1), Visit("/b")]))]
['/a', '/b']
"""

from __future__ import annotations

import typing
from typing import Any, Union

import msgspec

from streamstate.serializers.base import SerializerSnapshot, TypeSerializer, decode_concatenated
from streamstate.serializers.builtins import (
    BoolSerializer,
    BytesSerializer,
    DictSerializer,
    Float64Serializer,
    Int64Serializer,
    ListSerializer,
    OptionalSerializer,
    StrSerializer,
    TupleSerializer,
)
from streamstate.serializers.inference import VoidNamespaceSerializer
from streamstate.serializers.schema import AnySchema, BytesSchema, RecordSchema, TypeSchema
from streamstate.serializers.snapshot_schema import decoder_type, schema_of_snapshot
from streamstate.serializers.ttl import TtlValueSerializer
from streamstate.serializers.window_namespaces import GlobalWindowSerializer, TimeWindowSerializer

__all__ = [
    "GenericSerializer",
    "PickledBytesSerializer",
    "PlainRecordSerializer",
    "plain_serializer_from_snapshot",
    "readable_schema",
]

_SCALARS: dict[str, type[TypeSerializer[Any]]] = {
    "int64": Int64Serializer,
    "float64": Float64Serializer,
    "bool": BoolSerializer,
    "str": StrSerializer,
    "bytes": BytesSerializer,
    "void_namespace": VoidNamespaceSerializer,
    "time_window": TimeWindowSerializer,
    "global_window": GlobalWindowSerializer,
}
_ENCODER = msgspec.msgpack.Encoder()


class _SnapshotKeeper(TypeSerializer[Any]):
    """A stand-in serializer that describes itself with the snapshot it was rebuilt from."""

    def __init__(self, snapshot: SerializerSnapshot) -> None:
        self._snapshot = dict(snapshot)

    def snapshot(self) -> SerializerSnapshot:
        return dict(self._snapshot)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._snapshot!r})"


class PlainRecordSerializer(_SnapshotKeeper):
    """Values of a record type known only by its schema, read into ``PlainRecord`` structs with
    the same fields (and written back as the same msgpack).

    A record snapshot of the first format did not say whether the record itself was written as
    a msgpack map or array (``array_like``); its values read either way.
    """

    immutable = True

    def __init__(self, snapshot: SerializerSnapshot, schema: RecordSchema | TypeSchema) -> None:
        super().__init__(snapshot)
        self.schema = schema
        self.type_name = str(snapshot.get("type", "struct"))  # type: ignore[misc]
        wire = decoder_type(schema)
        if isinstance(schema, RecordSchema) and "schema" not in snapshot and not schema.array_like:
            array_form = _array_form(schema)
            if array_form is not None:
                wire = Union[wire, array_form]  # noqa: UP007 - a runtime union for msgspec
        self._wire = wire
        self._decoder = msgspec.msgpack.Decoder(wire)

    @property
    def wire_type(self) -> Any:
        return self._wire

    def serialize(self, value: Any) -> bytes:
        return _ENCODER.encode(value)

    def deserialize(self, data: bytes) -> Any:
        return self._decoder.decode(data)

    def deserialize_many(self, data: list[bytes]) -> list[Any]:
        values = decode_concatenated(data, self._wire)
        return super().deserialize_many(data) if values is None else values


class PickledBytesSerializer(_SnapshotKeeper):
    """Values written with pickle, kept as the bytes of their pickle stream: a reader of a
    checkpoint never unpickles (that would run code the checkpoint names)."""

    type_name = "pickle"
    immutable = True

    @property
    def wire_type(self) -> Any:
        return bytes

    def serialize(self, value: Any) -> bytes:
        return bytes(value)

    def deserialize(self, data: bytes) -> Any:
        return bytes(data)


class GenericSerializer(_SnapshotKeeper):
    """Values of a serializer this version does not know (or of a record type whose snapshot
    gives no schema), read as plain msgpack: dicts, lists, strings, numbers."""

    immutable = True

    @property
    def wire_type(self) -> Any:
        return Any

    def serialize(self, value: Any) -> bytes:
        return _ENCODER.encode(value)

    def deserialize(self, data: bytes) -> Any:
        return msgspec.msgpack.decode(data)

    def deserialize_many(self, data: list[bytes]) -> list[Any]:
        values = decode_concatenated(data, Any)
        return super().deserialize_many(data) if values is None else values


def _array_form(schema: RecordSchema) -> Any:
    """A named tuple of the record's fields: the record's values when it was written as a msgpack
    array (msgspec decodes a union of it and the record's struct by the msgpack type it finds),
    or None when its field names cannot name a tuple's fields."""
    fields = [(f.name, decoder_type(f.type)) for f in schema.fields]
    optional = 0
    for f in reversed(schema.fields):  # a named tuple's defaults are its last fields'
        if f.required:
            break
        optional += 1
    try:
        form: Any = typing.NamedTuple(schema.name or "record", fields)  # type: ignore[misc]
    except (TypeError, ValueError):  # a field named like a keyword or starting with "_"
        return None
    if optional:
        form.__new__.__defaults__ = (None,) * optional
        form._field_defaults = {f.name: None for f in schema.fields[-optional:]}
    return form


def plain_serializer_from_snapshot(snap: SerializerSnapshot) -> TypeSerializer[Any]:
    """A serializer that reads what the serializer described by ``snap`` wrote, rebuilt from the
    snapshot alone (see the module docstring)."""
    t = snap.get("type") if isinstance(snap, dict) else None
    if t in _SCALARS:
        return _SCALARS[str(t)]()
    if t == "optional":
        return OptionalSerializer(plain_serializer_from_snapshot(snap["inner"]))
    if t == "list":
        return ListSerializer(plain_serializer_from_snapshot(snap["element"]))
    if t == "dict":
        return DictSerializer(
            plain_serializer_from_snapshot(snap["key"]),
            plain_serializer_from_snapshot(snap["value"]),
        )
    if t == "tuple":
        return TupleSerializer(*(plain_serializer_from_snapshot(f) for f in snap["fields"]))
    if t == "ttl_value":
        return TtlValueSerializer(plain_serializer_from_snapshot(snap["inner"]))
    if t == "pickle":
        return PickledBytesSerializer(snap)
    if t == "struct":
        schema = schema_of_snapshot(snap)
        if schema is not None:
            return PlainRecordSerializer(snap, schema)
    return GenericSerializer(snap if isinstance(snap, dict) else {"type": repr(snap)})


def readable_schema(snap: SerializerSnapshot) -> TypeSchema:
    """The schema of the values :func:`plain_serializer_from_snapshot` reads: pickled values are
    bytes, values without a schema are :class:`~streamstate.serializers.schema.AnySchema`.

    >>> from streamstate.serializers.schema import describe_schema
    >>> describe_schema(readable_schema({"type": "list", "element": {"type": "pickle"}}))
    'list[bytes]'
    """
    return schema_of_snapshot(snap, unknown=_unknown_leaf) or AnySchema()


def _unknown_leaf(snap: Any) -> TypeSchema:
    if isinstance(snap, dict) and snap.get("type") == "pickle":
        return BytesSchema()
    return AnySchema()
