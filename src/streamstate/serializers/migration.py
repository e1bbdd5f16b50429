"""Reading checkpointed values as values of the serializer a program declares now (SPEC §14.1).

A state whose declaration changed compatibly (:mod:`~streamstate.serializers.evolution`) is
migrated once, when the program registers it after a restore: every stored value is read through
a :class:`MigratingSerializer` and kept, and written from then on, by the new serializer. It reads
the three forms a backend holds of an old value:

* a column of a snapshot file's entries section (msgpack; :attr:`~MigratingSerializer.wire_type`
  and :meth:`~MigratingSerializer.from_wire`, used by the format's ``StateCodec``);
* the bytes one value was stored as (RocksDB: :meth:`~MigratingSerializer.deserialize`);
* values already decoded with the checkpoint's own serializers (the heap's built-in states:
  :meth:`~MigratingSerializer.convert_values`, one msgpack round trip per column).

A direct migration (:attr:`SchemaChange.direct <streamstate.serializers.evolution.SchemaChange>`)
costs what reading the values as they are costs: the new serializer's decoder reads the old
msgpack. The others decode the old values into msgpack builtins, convert them, and decode the
result with the new type.

>>> from streamstate.serializers import Float64Serializer
>>> m = migrating_serializer({"type": "int64", "version": 1}, Float64Serializer(), now=0)
>>> m.deserialize((7).to_bytes(8, "big")), m.convert_values([1, 2])
(7.0, [1.0, 2.0])
"""

from __future__ import annotations

import struct
from typing import Any, ClassVar

import msgspec

from streamstate.serializers.base import (
    SerializerSnapshot,
    TypeSerializer,
    msgpack_array_header,
)
from streamstate.serializers.evolution import SchemaChange, resolve_schema_change
from streamstate.serializers.inference import serializer_from_snapshot

__all__ = ["MigratingSerializer", "migrating_serializer"]

#: snapshot types whose serialized bytes are the msgpack of their wire values
_MSGPACK_BYTES = frozenset(
    {"list", "dict", "tuple", "ttl_value", "struct", "time_window", "global_window"}
)
#: snapshot types of fixed-layout scalars (their bytes are not msgpack)
_SCALARS = frozenset({"int64", "float64", "bool", "str", "bytes"})


class MigratingSerializer(TypeSerializer[Any]):
    """Reads values written under ``old`` (a serializer snapshot) as values of ``new``, and
    writes as ``new`` does. ``now``: the restore's processing time in ms (the last access of
    entries whose time-to-live is turned on)."""

    type_name = "migrating"
    _encoder: ClassVar[msgspec.msgpack.Encoder] = msgspec.msgpack.Encoder()

    def __init__(
        self, old: SerializerSnapshot, new: TypeSerializer[Any], change: SchemaChange, now: int
    ) -> None:
        self.old = dict(old)
        self.new = new
        self.change = change
        self.now = now
        self._convert = change.converter()
        self._direct = self._convert is None
        self.immutable = new.immutable
        self.wire_native = self._direct and new.wire_native
        self.value_class = new.value_class
        self._new_decoder = msgspec.msgpack.Decoder(new.wire_type)
        self._new_list = msgspec.msgpack.Decoder(list[new.wire_type])  # type: ignore[name-defined]
        old_type = old.get("type")
        new_type = new.snapshot().get("type")
        self._same_bytes = (
            self._direct and old_type in _MSGPACK_BYTES and new_type in _MSGPACK_BYTES
        )
        self._old_reader = _old_value_reader(old)

    # ---- what is written: the new serializer's ------------------------------------------------

    def snapshot(self) -> SerializerSnapshot:
        return self.new.snapshot()

    def serialize(self, value: Any) -> bytes:
        return self.new.serialize(value)

    def to_wire(self, value: Any) -> Any:
        return self.new.to_wire(value)

    def copy(self, value: Any) -> Any:
        return self.new.copy(value)

    # ---- what is read: the old form -----------------------------------------------------------

    @property
    def wire_type(self) -> Any:
        """The type of the old values in a snapshot file: the new one when it reads them as
        they are, else any msgpack value (converted by :meth:`from_wire`)."""
        return self.new.wire_type if self._direct else Any

    def from_wire(self, wire: Any) -> Any:
        if self._direct:
            return self.new.from_wire(wire)
        assert self._convert is not None
        return self._typed(self._convert(wire, self.now))

    def deserialize(self, data: bytes) -> Any:
        """The new value of one value stored as the old serializer's bytes."""
        if self._same_bytes:
            return self.new.deserialize(data)
        wire = self._old_reader(data)
        if self._convert is not None:
            wire = self._convert(wire, self.now)
        return self._typed(wire)

    @property
    def reads_stored_bytes(self) -> bool:
        """Whether the new serializer reads a value stored by the old one from its bytes as it
        is (both store msgpack, and the new type reads the old one's data directly): stored
        values need no rewrite, each is converted when it is read."""
        return self._same_bytes

    def convert_stored(self, data: list[bytes]) -> list[bytes]:
        """The new serializer's bytes of values stored as the old one's bytes, a column at a
        time (one msgpack decode of the whole column where the old bytes allow it)."""
        if self._same_bytes:
            values = self._new_list.decode(msgpack_array_header(len(data)) + b"".join(data))
            if not self.new.wire_native:
                fr = self.new.from_wire
                values = [fr(v) for v in values]
        else:
            wire = self._old_column(data)
            values = self.convert_values(wire) if self._direct else self._converted(wire)
        return _serialize_column(self.new, values)

    def _old_column(self, data: list[bytes]) -> list[Any]:
        """The old values' msgpack builtins, from their stored bytes."""
        fixed = _FIXED_COLUMNS.get(str(self.old.get("type")))
        if fixed is not None:
            return [v for (v,) in fixed.iter_unpack(b"".join(data))]
        if str(self.old.get("type")) in _MSGPACK_BYTES:
            return msgspec.msgpack.decode(msgpack_array_header(len(data)) + b"".join(data))  # type: ignore[no-any-return]
        read = self._old_reader
        return [read(d) for d in data]

    def _converted(self, wire: list[Any]) -> list[Any]:
        convert, now = self._convert, self.now
        assert convert is not None
        out = self._new_list.decode(self._encoder.encode([convert(v, now) for v in wire]))
        if self.new.wire_native:
            return out  # type: ignore[no-any-return]
        fr = self.new.from_wire
        return [fr(v) for v in out]

    def convert_values(self, values: list[Any]) -> list[Any]:
        """The new values of values decoded with the checkpoint's own (built-in) serializers."""
        data = self._encoder.encode(values)
        if self._direct:
            out = self._new_list.decode(data)
        else:
            convert, now = self._convert, self.now
            assert convert is not None
            raw = [convert(v, now) for v in msgspec.msgpack.decode(data)]
            out = self._new_list.decode(self._encoder.encode(raw))
        if self.new.wire_native:
            return out  # type: ignore[no-any-return]
        fr = self.new.from_wire
        return [fr(v) for v in out]

    def _typed(self, wire: Any) -> Any:
        return self.new.from_wire(self._new_decoder.decode(self._encoder.encode(wire)))

    def __repr__(self) -> str:
        return f"MigratingSerializer({self.change.describe()!r} into {self.new!r})"


def migrating_serializer(
    old: SerializerSnapshot, new: TypeSerializer[Any], *, now: int
) -> TypeSerializer[Any] | None:
    """What reads values written under ``old`` as values of ``new``: ``new`` itself when it
    reads them as they are, a :class:`MigratingSerializer` when the rules of schema evolution
    say how to migrate them, None when neither snapshot describes a schema (the serializer's
    own :meth:`~streamstate.serializers.base.TypeSerializer.resolve_compatibility` decides,
    and ``new`` reads the old bytes).

    Raises ``ValueError`` when the change is incompatible (the restore checks refused it
    before).
    """
    snap = new.snapshot()
    if old == snap:
        return new
    change = resolve_schema_change(old, snap)
    if not change.known:
        return None
    if change.compatibility.is_incompatible:
        raise ValueError(f"values of {old} cannot become values of {new!r}: {change.describe()}")
    if change.compatibility.is_compatible_as_is:
        return new
    return MigratingSerializer(old, new, change, now)


def _old_value_reader(old: SerializerSnapshot) -> Any:
    """Bytes of one value as the old serializer stored it -> its msgpack builtins."""
    t = old.get("type")
    if t in _SCALARS:
        return serializer_from_snapshot(old).deserialize
    if t == "optional":
        inner = _old_value_reader(old.get("inner", {}))
        return lambda data: None if not data else inner(bytes(data)[1:])
    return msgspec.msgpack.decode


#: scalars stored fixed-width: a column of them is unpacked (or packed) in one call
_FIXED_COLUMNS = {"int64": struct.Struct(">q"), "float64": struct.Struct(">d")}


def _serialize_column(serializer: TypeSerializer[Any], values: list[Any]) -> list[bytes]:
    """``serializer.serialize`` of every value (fixed-width scalars packed at once)."""
    fixed = _FIXED_COLUMNS.get(serializer.type_name)
    if fixed is not None and values:
        try:
            packed = struct.pack(f">{len(values)}{fixed.format[-1]}", *values)
        except struct.error:
            pass  # a value out of range: the serializer's own error, below
        else:
            size = fixed.size
            return [packed[i : i + size] for i in range(0, len(packed), size)]
    write = serializer.serialize
    return [write(v) for v in values]
