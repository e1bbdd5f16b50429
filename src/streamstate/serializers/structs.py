"""Record types: ``msgspec.Struct`` classes, dataclasses and other types msgspec understands.

Values are msgpack-encoded and decoded against the class, so a checkpoint holds data only, never
code. The snapshot (version 2) stores the record's schema field by field
(``streamstate.serializers.schema``), and compatibility is judged by it
(:mod:`~streamstate.serializers.evolution`): a field added with a default, removed, reordered or
widened, or a class renamed or moved with the same fields, still reads old data. Version-1
snapshots (the class's qualified name and each field's type as text) are read too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import decimal
import enum
import uuid
from typing import Any, ClassVar

import msgspec

from streamstate.serializers.base import (
    Compatibility,
    SerializerSnapshot,
    TypeSerializer,
    decode_concatenated,
)
from streamstate.serializers.schema import schema_of_type, schema_to_builtins

__all__ = ["StructSerializer"]

_IMMUTABLE_LEAVES = (
    int,
    float,
    str,
    bytes,
    bool,
    type(None),
    datetime.datetime,
    datetime.date,
    datetime.time,
    datetime.timedelta,
    decimal.Decimal,
    uuid.UUID,
)


def _qualified_name(tp: Any) -> str:
    return f"{getattr(tp, '__module__', '?')}:{getattr(tp, '__qualname__', repr(tp))}"


def _v1_fields_of(tp: Any) -> list[dict[str, Any]] | None:
    """Field descriptions of a record type as version-1 snapshots held them (each type as the
    text of its msgspec repr), or None when ``tp`` is not a record type."""
    try:
        info = msgspec.inspect.type_info(tp)
    except Exception:
        return None
    fields = getattr(info, "fields", None)
    if fields is None:
        return None
    return [
        {
            "name": f.name,
            "type": repr(f.type),
            "required": bool(f.required),
        }
        for f in fields
    ]


def _is_frozen(tp: Any) -> bool:
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return bool(tp.__struct_config__.frozen)
    if dataclasses.is_dataclass(tp):
        return bool(tp.__dataclass_params__.frozen)  # type: ignore[union-attr]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return True
    return isinstance(tp, type) and issubclass(tp, _IMMUTABLE_LEAVES)


class StructSerializer(TypeSerializer[Any]):
    """Any type msgspec can encode: ``msgspec.Struct``, dataclasses, enums, datetimes, ...

    >>> import dataclasses
    >>> @dataclasses.dataclass
    ... class Point:
    ...     x: int
    ...     y: int = 0
    >>> s = StructSerializer(Point)
    >>> s.deserialize(s.serialize(Point(1, 2)))
    Point(x=1, y=2)
    """

    type_name = "struct"
    #: version 2 stores the record's schema (``"schema"``); version 1 kept each field's type as
    #: the text of its msgspec repr (``"fields"``), still read
    version = 2
    _encoder: ClassVar[msgspec.msgpack.Encoder] = msgspec.msgpack.Encoder()

    def __init__(self, cls: Any) -> None:
        try:
            self._decoder = msgspec.msgpack.Decoder(cls)
            info = msgspec.inspect.type_info(cls)
        except TypeError as exc:
            raise TypeError(f"{cls!r} cannot be serialized by msgspec: {exc}") from None
        if _has_custom_type(info):
            raise TypeError(
                f"{cls!r} is not a type msgspec can encode on its own (a dataclass, "
                "msgspec.Struct, enum, datetime, ... of such types); use one of those or opt in to "
                "pickle with PickleSerializer()"
            )
        self.cls = cls
        self.value_class = cls
        #: the record's schema as the snapshot stores it, made on first use (None for a type
        #: msgspec encodes that has none: an extension type)
        self._schema: dict[str, Any] | bool | None = False
        self.immutable = _is_frozen(cls) and _all_fields_immutable(cls)

    @property
    def wire_type(self) -> Any:
        return self.cls

    def serialize(self, value: Any) -> bytes:
        return self._encoder.encode(value)

    def deserialize(self, data: bytes) -> Any:
        return self._decoder.decode(data)

    def deserialize_many(self, data: list[bytes]) -> list[Any]:
        # only where the bytes are one msgpack value each (not a subclass's own deserialize)
        if type(self).deserialize is StructSerializer.deserialize:
            values = decode_concatenated(data, self.cls)
            if values is not None:
                return values
        return super().deserialize_many(data)

    def __getstate__(self) -> dict[str, Any]:
        # a descriptor made before the function is shipped carries its serializer: msgspec's
        # decoder does not pickle, and the receiving process builds its own from the class
        return {k: v for k, v in self.__dict__.items() if k != "_decoder"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._decoder = msgspec.msgpack.Decoder(self.cls)

    def copy(self, value: Any) -> Any:
        if self.immutable or value is None:
            return value
        return self._decoder.decode(self._encoder.encode(value))

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"class": _qualified_name(self.cls)}
        if self._schema is False:  # once: a serializer may be made per use, its schema not
            self._schema = None
            with contextlib.suppress(TypeError):
                self._schema = schema_to_builtins(schema_of_type(self.cls))
        if isinstance(self._schema, dict):
            out["schema"] = self._schema
        return out

    def v1_params(self) -> dict[str, Any]:
        """The parameters version 1 wrote for this class: its qualified name and each field's
        type as text."""
        out: dict[str, Any] = {"class": _qualified_name(self.cls)}
        fields = _v1_fields_of(self.cls)
        if fields is not None:
            out["fields"] = fields
        return out

    def v1_snapshot(self) -> SerializerSnapshot:
        """The snapshot version 1 wrote for this class (what checkpoints written before
        version 2 hold)."""
        return {"type": self.type_name, "version": 1, **self.v1_params()}

    def resolve_compatibility(self, old: SerializerSnapshot) -> Compatibility:
        """By the schema (:mod:`~streamstate.serializers.evolution`), never by the class's
        qualified name. A version-1 snapshot whose text cannot be read as a schema is judged
        by the version-1 rules: its class and field types unchanged, fields added with a
        default or removed."""
        if old.get("type") != self.type_name:
            return Compatibility.INCOMPATIBLE
        found = self.schema_compatibility(old)
        if found is not None:
            return found
        if old.get("version", 1) != 1:
            return Compatibility.INCOMPATIBLE
        return self._resolve_v1(old)

    def _resolve_v1(self, old: SerializerSnapshot) -> Compatibility:
        v1 = self.v1_snapshot()
        if old == v1:
            return Compatibility.COMPATIBLE_AS_IS
        if old.get("class") != v1.get("class"):
            return Compatibility.INCOMPATIBLE
        old_fields = {f["name"]: f for f in old.get("fields", [])}
        for f in v1.get("fields", []):
            prev = old_fields.get(f["name"])
            if prev is None:
                if f["required"]:
                    return Compatibility.INCOMPATIBLE  # old data has no value for it
            elif prev["type"] != f["type"]:
                return Compatibility.INCOMPATIBLE
        return Compatibility.COMPATIBLE_AFTER_MIGRATION


def _has_custom_type(info: Any, seen: set[int] | None = None) -> bool:
    seen = set() if seen is None else seen
    if id(info) in seen:  # recursive types refer back to themselves
        return False
    seen.add(id(info))
    if isinstance(info, msgspec.inspect.CustomType):
        return True
    subs: list[Any] = [getattr(info, a, None) for a in ("item_type", "key_type", "value_type")]
    for attr in ("types", "item_types"):
        subs.extend(getattr(info, attr, ()) or ())
    subs.extend(f.type for f in getattr(info, "fields", ()) or ())
    return any(s is not None and _has_custom_type(s, seen) for s in subs)


def _all_fields_immutable(tp: Any) -> bool:
    try:
        info = msgspec.inspect.type_info(tp)
    except Exception:
        return False
    fields = getattr(info, "fields", None)
    if fields is None:
        return True
    return all(_info_immutable(f.type) for f in fields)


def _info_immutable(t: Any) -> bool:
    simple = (
        msgspec.inspect.IntType,
        msgspec.inspect.FloatType,
        msgspec.inspect.StrType,
        msgspec.inspect.BytesType,
        msgspec.inspect.BoolType,
        msgspec.inspect.NoneType,
        msgspec.inspect.DateTimeType,
        msgspec.inspect.DateType,
        msgspec.inspect.DecimalType,
        msgspec.inspect.UUIDType,
        msgspec.inspect.EnumType,
        msgspec.inspect.LiteralType,
    )
    if isinstance(t, simple):
        return True
    if isinstance(t, msgspec.inspect.UnionType):
        return all(_info_immutable(x) for x in t.types)
    if isinstance(t, msgspec.inspect.TupleType):
        return all(_info_immutable(x) for x in t.item_types)
    return False
