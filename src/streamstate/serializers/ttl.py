"""The serializer of TTL-wrapped values: ``(last_access_timestamp_ms, user_value)`` (SPEC §8).

A state with time-to-live stores every user value together with the processing time it was last
written (or read, with ``OnReadAndWrite``). In memory the pair is a plain 2-tuple, the cheapest
object CPython has; on the wire it is a msgpack array ``[timestamp, value]``.

>>> from streamstate.serializers import Int64Serializer
>>> s = TtlValueSerializer(Int64Serializer())
>>> s.deserialize(s.serialize((1_000, 7)))
(1000, 7)
>>> s.snapshot()["type"]
'ttl_value'
"""

from __future__ import annotations

from typing import Any

from streamstate.serializers.base import Compatibility, SerializerSnapshot, TypeSerializer
from streamstate.serializers.builtins import MsgpackContainerSerializer

__all__ = ["TtlValueSerializer"]


class TtlValueSerializer(MsgpackContainerSerializer):
    """``(timestamp, value)`` pairs, the value written by ``inner``.

    Compatibility follows the inner serializer: a TTL state restores as long as the user's
    serializer can read the checkpointed user values; a state checkpointed without time-to-live
    (or read without it now) migrates (:mod:`~streamstate.serializers.evolution`).
    """

    type_name = "ttl_value"

    def __init__(self, inner: TypeSerializer[Any]) -> None:
        super().__init__()
        self.inner = inner
        self.immutable = inner.immutable
        self.wire_native = inner.wire_native

    @property
    def wire_type(self) -> Any:
        return tuple[int, self.inner.wire_type]  # type: ignore[name-defined]

    def to_wire(self, value: Any) -> Any:
        if self.wire_native:
            return value
        return (value[0], self.inner.to_wire(value[1]))

    def from_wire(self, wire: Any) -> Any:
        if self.wire_native:
            return wire
        return (wire[0], self.inner.from_wire(wire[1]))

    def copy(self, value: Any) -> Any:
        if self.immutable or value is None:
            return value
        return (value[0], self.inner.copy(value[1]))

    def check(self, value: Any) -> None:
        # the timestamp is the TTL decorator's; the value is the user's
        self.inner.check(value[1])

    def params(self) -> dict[str, Any]:
        return {"inner": self.inner.snapshot()}

    def resolve_compatibility(self, old: SerializerSnapshot) -> Compatibility:
        found = self.schema_compatibility(old)
        if found is not None:
            return found
        if old.get("type") != self.type_name:
            return Compatibility.INCOMPATIBLE
        return self.inner.resolve_compatibility(old["inner"])
