"""Record types: ``msgspec.Struct`` classes, dataclasses and other types msgspec understands.

Values are msgpack-encoded and decoded against the class, so a checkpoint holds data only, never
code. Schema evolution follows msgspec's rules: a field added with a default, or a field removed,
still reads old data (``COMPATIBLE_AFTER_MIGRATION``); a changed field type does not.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import uuid
from typing import Any, ClassVar

import msgspec

from streamstate.serializers.base import Compatibility, SerializerSnapshot, TypeSerializer

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


def _fields_of(tp: Any) -> list[dict[str, Any]] | None:
    """Field descriptions of a record type, or None when ``tp`` is not a record type."""
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
        self.immutable = _is_frozen(cls) and _all_fields_immutable(cls)

    @property
    def wire_type(self) -> Any:
        return self.cls

    def serialize(self, value: Any) -> bytes:
        return self._encoder.encode(value)

    def deserialize(self, data: bytes) -> Any:
        return self._decoder.decode(data)

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
        fields = _fields_of(self.cls)
        if fields is not None:
            out["fields"] = fields
        return out

    def resolve_compatibility(self, old: SerializerSnapshot) -> Compatibility:
        if old.get("type") != self.type_name:
            return Compatibility.INCOMPATIBLE
        new = self.snapshot()
        if old == new:
            return Compatibility.COMPATIBLE_AS_IS
        if old.get("class") != new.get("class"):
            return Compatibility.INCOMPATIBLE
        old_fields = {f["name"]: f for f in old.get("fields", [])}
        new_fields = {f["name"]: f for f in new.get("fields", [])}
        for name, f in new_fields.items():
            prev = old_fields.get(name)
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
