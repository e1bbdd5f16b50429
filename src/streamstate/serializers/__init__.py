"""Serializers: typed, versioned, compatibility-checked (SPEC §2.4)."""

from streamstate.serializers.base import (
    Compatibility,
    SerializerSnapshot,
    TypeSerializer,
    describe_snapshot,
)
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
from streamstate.serializers.inference import (
    Types,
    VoidNamespaceSerializer,
    serializer_for,
    serializer_from_snapshot,
)
from streamstate.serializers.pickle import PickleSerializer
from streamstate.serializers.structs import StructSerializer
from streamstate.serializers.ttl import TtlValueSerializer

__all__ = [
    "BoolSerializer",
    "BytesSerializer",
    "Compatibility",
    "DictSerializer",
    "Float64Serializer",
    "Int64Serializer",
    "ListSerializer",
    "OptionalSerializer",
    "PickleSerializer",
    "SerializerSnapshot",
    "StrSerializer",
    "StructSerializer",
    "TtlValueSerializer",
    "TupleSerializer",
    "TypeSerializer",
    "Types",
    "VoidNamespaceSerializer",
    "describe_snapshot",
    "serializer_for",
    "serializer_from_snapshot",
]
