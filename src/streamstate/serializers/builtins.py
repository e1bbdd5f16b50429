"""Typed serializers for Python's built-in value types (SPEC §2.4).

Scalars use fixed-width big-endian layouts (int64, float64, bool) or their natural bytes (str as
UTF-8, bytes as is); containers use msgpack through ``msgspec`` with a typed decoder, so reading
a checkpoint never executes code stored in it.
"""

from __future__ import annotations

import struct
from typing import Annotated, Any, ClassVar, Optional

import msgspec

from streamstate.serializers.base import (
    Compatibility,
    SerializerSnapshot,
    TypeSerializer,
    decode_concatenated,
)

__all__ = [
    "BoolSerializer",
    "BytesSerializer",
    "DictSerializer",
    "Float64Serializer",
    "Int64Serializer",
    "ListSerializer",
    "MsgpackContainerSerializer",
    "OptionalSerializer",
    "StrSerializer",
    "TupleSerializer",
]

_I64 = struct.Struct(">q")
_INT64_WIRE = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
_F64 = struct.Struct(">d")


class Int64Serializer(TypeSerializer[int]):
    """Signed 64-bit integers, 8 bytes big-endian.

    >>> s = Int64Serializer(); s.deserialize(s.serialize(-5))
    -5
    """

    type_name = "int64"
    fixed_length = 8
    immutable = True
    value_class = int

    def serialize(self, value: int) -> bytes:
        try:
            return _I64.pack(value)
        except struct.error:
            raise TypeError(f"{value!r} is not a signed 64-bit integer") from None

    def deserialize(self, data: bytes) -> int:
        return _I64.unpack(data)[0]  # type: ignore[no-any-return]

    def deserialize_many(self, data: list[bytes]) -> list[int]:
        if set(map(len, data)) != {8}:  # none, or one that is not 8 bytes: its own error
            return super().deserialize_many(data)
        return list(struct.unpack(f">{len(data)}q", b"".join(data)))

    @property
    def wire_type(self) -> Any:
        # msgpack holds integers up to 2**64 - 1: a checkpoint's value outside int64 is refused
        # when it is decoded, not when a backend stores it (RocksDB packs 8 bytes)
        return _INT64_WIRE

    def copy(self, value: int) -> int:
        return value


class Float64Serializer(TypeSerializer[float]):
    """IEEE-754 doubles, 8 bytes big-endian."""

    type_name = "float64"
    fixed_length = 8
    immutable = True
    value_class = float

    def serialize(self, value: float) -> bytes:
        try:
            return _F64.pack(value)
        except struct.error:
            raise TypeError(f"{value!r} is not a float") from None

    def deserialize(self, data: bytes) -> float:
        return _F64.unpack(data)[0]  # type: ignore[no-any-return]

    def deserialize_many(self, data: list[bytes]) -> list[float]:
        if set(map(len, data)) != {8}:
            return super().deserialize_many(data)
        return list(struct.unpack(f">{len(data)}d", b"".join(data)))

    @property
    def wire_type(self) -> Any:
        return float

    def copy(self, value: float) -> float:
        return value


class BoolSerializer(TypeSerializer[bool]):
    """Booleans, one byte."""

    type_name = "bool"
    fixed_length = 1
    immutable = True
    value_class = bool

    def serialize(self, value: bool) -> bytes:
        if type(value) is not bool:
            raise TypeError(f"{value!r} is not a bool")
        return b"\x01" if value else b"\x00"

    def deserialize(self, data: bytes) -> bool:
        return data != b"\x00"

    @property
    def wire_type(self) -> Any:
        return bool

    def copy(self, value: bool) -> bool:
        return value


class StrSerializer(TypeSerializer[str]):
    """Unicode strings as UTF-8."""

    type_name = "str"
    immutable = True
    value_class = str

    def serialize(self, value: str) -> bytes:
        if type(value) is not str:
            raise TypeError(f"{value!r} is not a str")
        return value.encode("utf-8", "surrogatepass")

    def deserialize(self, data: bytes) -> str:
        return bytes(data).decode("utf-8", "surrogatepass")

    def deserialize_many(self, data: list[bytes]) -> list[str]:
        try:  # strict UTF-8 reads what it accepts as surrogatepass does, and faster
            return [d.decode() for d in data]
        except (UnicodeDecodeError, AttributeError):  # lone surrogates; a memoryview
            return [bytes(d).decode("utf-8", "surrogatepass") for d in data]

    @property
    def wire_type(self) -> Any:
        return str

    def copy(self, value: str) -> str:
        return value


class BytesSerializer(TypeSerializer[bytes]):
    """Byte strings, as they are."""

    type_name = "bytes"
    immutable = True
    value_class = bytes

    def serialize(self, value: bytes) -> bytes:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"{value!r} is not bytes")
        return bytes(value)

    def deserialize(self, data: bytes) -> bytes:
        return bytes(data)

    @property
    def wire_type(self) -> Any:
        return bytes

    def copy(self, value: bytes) -> bytes:
        return value


class MsgpackContainerSerializer(TypeSerializer[Any]):
    """Base of container serializers (here and ``ttl.py``): msgpack bytes decoded against
    ``wire_type``; a subclass gives ``wire_type``, ``to_wire`` and ``from_wire``."""

    _encoder: ClassVar[msgspec.msgpack.Encoder] = msgspec.msgpack.Encoder()

    def __init__(self) -> None:
        self._decoder: msgspec.msgpack.Decoder[Any] | None = None

    def _dec(self) -> msgspec.msgpack.Decoder[Any]:
        if self._decoder is None:
            self._decoder = msgspec.msgpack.Decoder(self.wire_type)
        return self._decoder

    def __getstate__(self) -> dict[str, Any]:
        # msgspec's decoder does not pickle; the receiving process builds its own when needed
        return {**self.__dict__, "_decoder": None}

    def serialize(self, value: Any) -> bytes:
        return self._encoder.encode(self.to_wire(value))

    def deserialize(self, data: bytes) -> Any:
        return self.from_wire(self._dec().decode(data))

    def deserialize_many(self, data: list[bytes]) -> list[Any]:
        # only where the bytes are one msgpack value each (not a subclass's own deserialize)
        if type(self).deserialize is not MsgpackContainerSerializer.deserialize:
            return super().deserialize_many(data)
        wires = decode_concatenated(data, self.wire_type)
        if wires is None:
            return super().deserialize_many(data)
        if self.wire_native:
            return wires
        from_wire = self.from_wire
        return [from_wire(w) for w in wires]


class OptionalSerializer(MsgpackContainerSerializer):
    """``X | None`` for an inner serializer of ``X``.

    Reads data written by the inner serializer alone (the value simply was never ``None``).
    """

    type_name = "optional"

    def __init__(self, inner: TypeSerializer[Any]) -> None:
        super().__init__()
        self.inner = inner
        self.immutable = inner.immutable
        self.wire_native = inner.wire_native

    @property
    def wire_type(self) -> Any:
        return Optional[self.inner.wire_type]  # noqa: UP045 - a runtime type object is needed

    def serialize(self, value: Any) -> bytes:
        if value is None:
            return b""
        return b"\x01" + self.inner.serialize(value)

    def deserialize(self, data: bytes) -> Any:
        if not data:
            return None
        return self.inner.deserialize(data[1:])

    def to_wire(self, value: Any) -> Any:
        return None if value is None else self.inner.to_wire(value)

    def from_wire(self, wire: Any) -> Any:
        return None if wire is None else self.inner.from_wire(wire)

    def copy(self, value: Any) -> Any:
        return None if value is None else self.inner.copy(value)

    def check(self, value: Any) -> None:
        if value is not None:
            self.inner.check(value)

    def params(self) -> dict[str, Any]:
        return {"inner": self.inner.snapshot()}

    def resolve_compatibility(self, old: SerializerSnapshot) -> Compatibility:
        found = self.schema_compatibility(old)
        if found is not None:
            return found
        if old.get("type") == self.type_name:
            return self.inner.resolve_compatibility(old["inner"])
        inner = self.inner.resolve_compatibility(old)
        if inner.is_incompatible:
            return inner
        return Compatibility.COMPATIBLE_AFTER_MIGRATION


class TupleSerializer(MsgpackContainerSerializer):
    """Fixed-arity tuples with one serializer per position."""

    type_name = "tuple"
    value_class = tuple

    def __init__(self, *fields: TypeSerializer[Any]) -> None:
        super().__init__()
        self.fields = tuple(fields)
        self.immutable = all(f.immutable for f in fields)
        self.wire_native = all(f.wire_native for f in fields)

    @property
    def wire_type(self) -> Any:
        return tuple[tuple(f.wire_type for f in self.fields)] if self.fields else tuple[()]  # type: ignore[misc]

    def to_wire(self, value: Any) -> Any:
        if self.wire_native:
            return value
        return tuple(f.to_wire(v) for f, v in zip(self.fields, value, strict=True))

    def from_wire(self, wire: Any) -> Any:
        if self.wire_native:
            return wire
        return tuple(f.from_wire(v) for f, v in zip(self.fields, wire, strict=True))

    def copy(self, value: Any) -> Any:
        if self.immutable or value is None:
            return value
        return tuple(f.copy(v) for f, v in zip(self.fields, value, strict=True))

    def params(self) -> dict[str, Any]:
        return {"fields": [f.snapshot() for f in self.fields]}

    def resolve_compatibility(self, old: SerializerSnapshot) -> Compatibility:
        found = self.schema_compatibility(old)
        if found is not None:
            return found
        if old.get("type") != self.type_name or len(old.get("fields", ())) != len(self.fields):
            return Compatibility.INCOMPATIBLE
        return _combine(
            f.resolve_compatibility(o) for f, o in zip(self.fields, old["fields"], strict=True)
        )


class ListSerializer(MsgpackContainerSerializer):
    """Python lists of one element type."""

    type_name = "list"
    value_class = list

    def __init__(self, element: TypeSerializer[Any]) -> None:
        super().__init__()
        self.element = element
        self.wire_native = element.wire_native

    @property
    def wire_type(self) -> Any:
        return list[self.element.wire_type]  # type: ignore[name-defined]

    def to_wire(self, value: Any) -> Any:
        if self.wire_native:
            return value
        to = self.element.to_wire
        return [to(v) for v in value]

    def from_wire(self, wire: Any) -> Any:
        if self.wire_native:
            return wire
        fr = self.element.from_wire
        return [fr(v) for v in wire]

    def copy(self, value: Any) -> Any:
        if value is None:
            return None
        if self.element.immutable:
            return list(value)
        cp = self.element.copy
        return [cp(v) for v in value]

    def params(self) -> dict[str, Any]:
        return {"element": self.element.snapshot()}

    def resolve_compatibility(self, old: SerializerSnapshot) -> Compatibility:
        found = self.schema_compatibility(old)
        if found is not None:
            return found
        if old.get("type") != self.type_name:
            return Compatibility.INCOMPATIBLE
        return self.element.resolve_compatibility(old["element"])


class DictSerializer(MsgpackContainerSerializer):
    """Python dicts with one key type and one value type."""

    type_name = "dict"
    value_class = dict

    def __init__(self, key: TypeSerializer[Any], value: TypeSerializer[Any]) -> None:
        super().__init__()
        self.key = key
        self.value = value
        self.wire_native = key.wire_native and value.wire_native

    @property
    def wire_type(self) -> Any:
        return dict[self.key.wire_type, self.value.wire_type]  # type: ignore[name-defined]

    def to_wire(self, value: Any) -> Any:
        if self.wire_native:
            return value
        kt, vt = self.key.to_wire, self.value.to_wire
        return {kt(k): vt(v) for k, v in value.items()}

    def from_wire(self, wire: Any) -> Any:
        if self.wire_native:
            return wire
        kf, vf = self.key.from_wire, self.value.from_wire
        return {kf(k): vf(v) for k, v in wire.items()}

    def copy(self, value: Any) -> Any:
        if value is None:
            return None
        if self.value.immutable and self.key.immutable:
            return dict(value)
        kc, vc = self.key.copy, self.value.copy
        return {kc(k): vc(v) for k, v in value.items()}

    def params(self) -> dict[str, Any]:
        return {"key": self.key.snapshot(), "value": self.value.snapshot()}

    def resolve_compatibility(self, old: SerializerSnapshot) -> Compatibility:
        found = self.schema_compatibility(old)
        if found is not None:
            return found
        if old.get("type") != self.type_name:
            return Compatibility.INCOMPATIBLE
        return _combine(
            [
                self.key.resolve_compatibility(old["key"]),
                self.value.resolve_compatibility(old["value"]),
            ]
        )


def _combine(results: Any) -> Compatibility:
    out = Compatibility.COMPATIBLE_AS_IS
    for r in results:
        if r is Compatibility.INCOMPATIBLE:
            return r
        if r is Compatibility.COMPATIBLE_AFTER_MIGRATION:
            out = r
    return out
