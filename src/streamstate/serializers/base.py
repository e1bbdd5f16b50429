"""The serializer contract (SPEC §2.4).

A :class:`TypeSerializer` turns values of one type into bytes and back, copies values (a deep
copy for mutable values: the copy-on-write state map hands copies of shared state to user
code), and describes itself with a small JSON-able *snapshot*. Snapshots are written into every
checkpoint; on restore the serializer the program now declares resolves its compatibility with
the snapshot it finds there.

Bulk encoding: every serializer names a ``wire_type``, a type hint that ``msgspec`` can encode and
decode. When ``wire_native`` is true the Python values *are* wire values, so a whole key-group
block of a checkpoint is encoded or decoded by one ``msgspec`` call in C. Serializers whose
values are not wire-native (pickle) convert with :meth:`TypeSerializer.to_wire` and
:meth:`TypeSerializer.from_wire`.

Bulk decoding of bytes: :meth:`TypeSerializer.deserialize_many` reads many values' bytes at once
(a RocksDB key group's values); a serializer whose bytes are one msgpack value each decodes them
as one msgpack array (``decode_concatenated``), fixed-width numbers in one ``struct`` call.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Generic, TypeVar

import msgspec

from streamstate.serializers.compatibility import Compatibility, describe_snapshot
from streamstate.serializers.evolution import resolve_schema_change

__all__ = [
    "Compatibility",
    "SerializerSnapshot",
    "TypeSerializer",
    "decode_concatenated",
    "describe_snapshot",
    "msgpack_array_header",
]

T = TypeVar("T")

SerializerSnapshot = dict[str, Any]
"""A JSON-able description of a serializer: ``{"type": ..., "version": ..., ...params}``."""


class TypeSerializer(ABC, Generic[T]):
    """Serializes, deserializes and copies values of one type.

    Subclasses set ``type_name`` (the stable identifier stored in snapshots) and ``version``
    (bumped when the byte format changes).
    """

    type_name: ClassVar[str] = ""
    version: ClassVar[int] = 1

    #: byte length of every serialized value, or -1 when it varies
    fixed_length: int = -1
    #: values are never mutated in place, so :meth:`copy` may return the value itself
    immutable: bool = False
    #: values can be handed to msgspec as they are (see module docstring)
    wire_native: bool = True
    #: the class of this serializer's values: a value of exactly this class passes
    #: :meth:`check` with one comparison, which the states make on every write (None: no
    #: such class, every value is checked in full)
    value_class: type | None = None

    # -- bytes ------------------------------------------------------------------------------

    @abstractmethod
    def serialize(self, value: T) -> bytes:
        """The bytes of ``value``."""

    @abstractmethod
    def deserialize(self, data: bytes) -> T:
        """The value whose bytes are ``data``."""

    def deserialize_many(self, data: list[bytes]) -> list[T]:
        """The values whose bytes are the items of ``data``, in order: what :meth:`deserialize`
        gives for each (and the error it raises for the first it cannot read). Serializers
        whose bytes allow it read them all in one call."""
        deserialize = self.deserialize
        return [deserialize(d) for d in data]

    # -- bulk -------------------------------------------------------------------------------

    @property
    @abstractmethod
    def wire_type(self) -> Any:
        """The msgspec type hint of this serializer's wire values."""

    def to_wire(self, value: T) -> Any:
        """The wire value of ``value`` (identity when ``wire_native``)."""
        return value

    def from_wire(self, wire: Any) -> T:
        """The value of a decoded wire value (identity when ``wire_native``)."""
        return wire  # type: ignore[no-any-return]

    # -- copies -----------------------------------------------------------------------------

    def copy(self, value: T) -> T:
        """A copy of ``value`` that shares no mutable part with it."""
        if self.immutable or value is None:
            return value
        return self.deserialize(self.serialize(value))

    # -- compatibility ----------------------------------------------------------------------

    def params(self) -> dict[str, Any]:
        """Parameters that, with the type name, identify this serializer's format."""
        return {}

    def snapshot(self) -> SerializerSnapshot:
        """A JSON-able description of this serializer, written into checkpoints."""
        return {"type": self.type_name, "version": self.version, **self.params()}

    def resolve_compatibility(self, old: SerializerSnapshot) -> Compatibility:
        """How this serializer can read data written by the serializer described by ``old``.

        The default follows the rules of schema evolution
        (:func:`~streamstate.serializers.evolution.resolve_schema_change`): identical snapshots,
        or snapshots of the same schema, are compatible as is; a widening (a record field added
        with a default or removed, ``int`` to ``float``, ``T`` to ``T | None``, ...) is
        compatible after migration; anything else, and any difference between snapshots that
        describe no schema, is incompatible. A serializer with other rules overrides this.
        """
        found = self.schema_compatibility(old)
        return Compatibility.INCOMPATIBLE if found is None else found

    def schema_compatibility(self, old: SerializerSnapshot) -> Compatibility | None:
        """The compatibility the rules of schema evolution give, or None when ``old`` or this
        serializer's snapshot describes no schema and the two differ."""
        new = self.snapshot()
        if old == new:
            return Compatibility.COMPATIBLE_AS_IS
        change = resolve_schema_change(old, new)
        return change.compatibility if change.known else None

    # -- conveniences -----------------------------------------------------------------------

    def check(self, value: Any) -> None:
        """Raise ``TypeError`` if ``value`` cannot be written by this serializer.

        The states call it on every write whose value is not exactly a :attr:`value_class`
        (so ``"x"`` into an ``int`` state fails where it is written, not at the next
        checkpoint); an instance of :attr:`value_class` is taken as it is, and what is inside
        a container is checked when the state is serialized. Cost: a serialize/deserialize
        round trip.
        """
        if value.__class__ is self.value_class:
            return
        try:
            self.deserialize(self.serialize(value))
        except Exception as exc:  # serializers raise what their codec raises
            raise TypeError(f"{_short(value)} cannot be written by {self!r}: {exc}") from None

    def validate(self, value: Any) -> None:
        """Raise ``TypeError`` if ``value`` cannot be written by this serializer."""
        try:
            msgspec.convert(self.to_wire(value), self.wire_type, strict=True)
        except (msgspec.ValidationError, TypeError) as exc:
            raise TypeError(f"{value!r} cannot be written by {self!r}: {exc}") from None

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.snapshot() == self.snapshot()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), repr(self.snapshot())))

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({params})"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


_RAW_ARRAY = msgspec.msgpack.Decoder(list[msgspec.Raw])


@functools.lru_cache(maxsize=256)
def _list_decoder(wire_type: Any) -> msgspec.msgpack.Decoder[Any]:
    return msgspec.msgpack.Decoder(list[wire_type])  # type: ignore[valid-type]


def msgpack_array_header(n: int) -> bytes:
    """The msgpack header of an array of ``n`` values (the values' own msgpack follows it)."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def decode_concatenated(data: list[bytes], wire_type: Any) -> list[Any] | None:
    """``data``, each item the msgpack of one value of ``wire_type``, decoded in one ``msgspec``
    call as the items of one msgpack array; None when an item is not exactly one msgpack value
    of that type (read them one by one then, for the item's own error). An item is decoded from
    its own bytes only: the array's items are checked to span exactly ``data``'s items first."""
    if not data:
        return []
    buffer = msgpack_array_header(len(data)) + b"".join(data)
    try:
        extents = _RAW_ARRAY.decode(buffer)
        if list(map(len, extents)) != list(map(len, data)):
            return None
        try:
            decoder = _list_decoder(wire_type)
        except TypeError:  # a wire type that does not hash
            decoder = msgspec.msgpack.Decoder(list[wire_type])  # type: ignore[valid-type]
        return decoder.decode(buffer)  # type: ignore[no-any-return]
    except msgspec.DecodeError:  # ValidationError included
        return None
