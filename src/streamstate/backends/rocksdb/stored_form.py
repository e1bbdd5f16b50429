"""A restored state written into RocksDB as the checkpoint describes it, without the program's
serializers (SPEC §14.1).

A restore from snapshot files keeps each state in its files until the program registers it,
so that its values are decoded once, straight into what the program declares (migrated if the
declaration changed). A state the program never registers must still reach every later
checkpoint: before a snapshot (or a scan of it) the backend writes it as the checkpoint's
serializers would have stored it, from the files' bytes, without decoding a value. In a snapshot
file a value is the msgpack of its serializer's wire value; RocksDB stores what the serializer's
``serialize`` gives, which for records, containers and TTL pairs *is* that msgpack, and for the
built-in scalars, ``X | None`` and pickled values a small transformation of it
(:func:`stored_bytes`).
No class named by the checkpoint is imported and nothing is unpickled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from streamstate.errors import CheckpointError
from streamstate.serializers import serializer_from_snapshot
from streamstate.serializers.base import SerializerSnapshot, TypeSerializer

__all__ = ["StoredForm", "stored_bytes"]

#: snapshot types whose ``serialize`` is the msgpack of their wire value
_MSGPACK = frozenset(
    {"list", "dict", "tuple", "ttl_value", "struct", "time_window", "global_window"}
)
_SCALARS = frozenset({"int64", "float64", "bool", "str", "bytes"})
_NIL = b"\xc0"


def stored_bytes(snap: SerializerSnapshot, where: str) -> Callable[[bytes], bytes]:
    """From the msgpack of a wire value (a snapshot file's) to the bytes the serializer of
    ``snap`` stores in RocksDB. ``where`` names the state in the error for a serializer whose
    stored form cannot be known without the program."""
    t = snap.get("type")
    if t in _MSGPACK:
        return bytes
    if t in _SCALARS:
        serializer = serializer_from_snapshot(snap)
        decode = msgspec.msgpack.Decoder(serializer.wire_type).decode
        write = serializer.serialize
        return lambda raw: write(decode(raw))  # type: ignore[no-any-return]
    if t == "optional":
        inner = stored_bytes(snap.get("inner", {}), where)
        return lambda raw: b"" if bytes(raw) == _NIL else b"\x01" + inner(raw)
    if t == "pickle":  # a msgpack bin holding the pickle stream: never unpickled here
        return lambda raw: bytes(msgspec.msgpack.decode(raw, type=bytes))
    raise CheckpointError(
        f"{where}: its values ({t} serializer) cannot be written without the program's "
        "serializer; register the state before the next checkpoint"
    )


class StoredForm(TypeSerializer[Any]):
    """Stands in for a restored state's serializer while its entries are written as the
    checkpoint stored them: its values are the msgpack bytes of the snapshot files, written
    through :func:`stored_bytes` (a map state: its mappings, each value so, each key with the
    checkpoint's map-key serializer, which must be built in)."""

    type_name = "stored_form"
    wire_native = False
    immutable = True

    def __init__(self, snap: SerializerSnapshot, kind: str, where: str) -> None:
        self._snapshot = dict(snap)
        self._map = kind == "map"
        self._wire: Any
        if self._map:
            self.key = serializer_from_snapshot(snap["key"])
            self.value = _Bytes(stored_bytes(snap["value"], where))
            key_wire = self.key.wire_type
            self._wire = dict[key_wire, msgspec.Raw]  # type: ignore[valid-type]
        else:
            self._write = stored_bytes(snap, where)
            self._wire = msgspec.Raw

    def snapshot(self) -> SerializerSnapshot:
        return dict(self._snapshot)

    @property
    def wire_type(self) -> Any:
        return self._wire

    def from_wire(self, wire: Any) -> Any:
        if self._map:
            fr = self.key.from_wire
            return {fr(k): bytes(v) for k, v in wire.items()}
        return bytes(wire)

    def serialize(self, value: Any) -> bytes:
        return self._write(value)

    def deserialize(self, data: bytes) -> Any:
        raise NotImplementedError("a stored form is written, never read")


class _Bytes(TypeSerializer[Any]):
    """A map state's values in their stored form."""

    type_name = "stored_form"

    def __init__(self, write: Callable[[bytes], bytes]) -> None:
        self._write = write

    @property
    def wire_type(self) -> Any:
        return msgspec.Raw

    def serialize(self, value: Any) -> bytes:
        return self._write(value)

    def deserialize(self, data: bytes) -> Any:
        raise NotImplementedError("a stored form is written, never read")
