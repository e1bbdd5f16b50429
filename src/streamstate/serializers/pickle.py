"""Pickle, as an explicit opt-in only (SPEC §2.4).

Unpickling executes code named by the data, so a checkpoint written with pickle is only as
trustworthy as its storage. streamstate never picks this serializer on its own: a program must
pass ``PickleSerializer()`` to a descriptor, and a checkpoint that needs pickle is refused on
restore unless the program declares pickle for that state again.
"""

from __future__ import annotations

import pickle
from typing import Any

from streamstate.serializers.base import Compatibility, SerializerSnapshot, TypeSerializer
from streamstate.serializers.class_pickling import dumps

__all__ = ["PickleSerializer"]


class PickleSerializer(TypeSerializer[Any]):
    """Any picklable value (cloudpickle for functions and local classes)."""

    type_name = "pickle"
    wire_native = False

    def __init__(self, protocol: int = pickle.HIGHEST_PROTOCOL) -> None:
        self.protocol = protocol

    @property
    def wire_type(self) -> Any:
        return bytes

    def serialize(self, value: Any) -> bytes:
        # the classes of the job script arrive whole in another process (class_pickling.py)
        return dumps(value, protocol=self.protocol)

    def deserialize(self, data: bytes) -> Any:
        return pickle.loads(data)

    def check(self, value: Any) -> None:
        """Anything may be pickled: nothing to check per write (a pickling error shows at the
        checkpoint)."""

    def to_wire(self, value: Any) -> Any:
        return self.serialize(value)

    def from_wire(self, wire: Any) -> Any:
        return self.deserialize(wire)

    def resolve_compatibility(self, old: SerializerSnapshot) -> Compatibility:
        # The pickle protocol is recorded in every pickle stream, so any version reads.
        if old.get("type") == self.type_name:
            return Compatibility.COMPATIBLE_AS_IS
        return Compatibility.INCOMPATIBLE
