"""Choosing a serializer from a Python type, and rebuilding one from its snapshot.

``serializer_for(int)`` gives a typed serializer; pickle is never chosen implicitly (SPEC §2.4).
:class:`Types` offers PyFlink-style constructors (``Types.LONG()``, ``Types.LIST(Types.STRING())``)
for users coming from PyFlink.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any

import msgspec

from streamstate.errors import (
    PickleNotAllowedError,
    SerializerSnapshotError,
    StateMigrationException,
)
from streamstate.namespace import VoidNamespace
from streamstate.serializers.base import SerializerSnapshot, TypeSerializer
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
from streamstate.serializers.pickle import PickleSerializer
from streamstate.serializers.structs import StructSerializer

__all__ = ["Types", "VoidNamespaceSerializer", "serializer_for", "serializer_from_snapshot"]


class VoidNamespaceSerializer(StructSerializer):
    """The serializer of :data:`~streamstate.namespace.VOID_NAMESPACE`."""

    type_name = "void_namespace"
    #: built in: the snapshot keeps its first form (version 1)
    version = 1

    def __init__(self) -> None:
        super().__init__(VoidNamespace)
        self.immutable = True

    def params(self) -> dict[str, Any]:
        return {}


_SCALARS: dict[Any, type[TypeSerializer[Any]]] = {
    int: Int64Serializer,
    float: Float64Serializer,
    bool: BoolSerializer,
    str: StrSerializer,
    bytes: BytesSerializer,
}


def serializer_for(tp: Any) -> TypeSerializer[Any]:
    """A typed serializer for the type hint ``tp`` (or ``tp`` itself if it is a serializer).

    >>> serializer_for(int)
    Int64Serializer()
    >>> serializer_for(list[str])
    ListSerializer(element=...)
    """
    if isinstance(tp, TypeSerializer):
        return tp
    if isinstance(tp, type) and issubclass(tp, TypeSerializer):
        return tp()
    if tp in _SCALARS:
        return _SCALARS[tp]()
    if tp is VoidNamespace:
        return VoidNamespaceSerializer()
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1 and len(args) == 2:
            return OptionalSerializer(serializer_for(non_none[0]))
        return StructSerializer(tp)
    if origin is list and len(args) == 1:
        return ListSerializer(serializer_for(args[0]))
    if origin is dict and len(args) == 2:
        return DictSerializer(serializer_for(args[0]), serializer_for(args[1]))
    if origin is tuple and args and args[-1] is not Ellipsis:
        return TupleSerializer(*(serializer_for(a) for a in args))
    if tp in (list, dict, tuple, set, object, Any) or tp is None:
        raise TypeError(
            f"cannot choose a serializer for {tp!r}: give the element types "
            "(e.g. list[int], dict[str, float]) or pass a TypeSerializer; "
            "pickle is only used when PickleSerializer() is passed explicitly"
        )
    if (
        (isinstance(tp, type) and issubclass(tp, (msgspec.Struct, enum.Enum)))
        or dataclasses.is_dataclass(tp)
        or origin is not None
    ):
        return StructSerializer(tp)
    try:
        return StructSerializer(tp)
    except TypeError:
        raise TypeError(
            f"cannot choose a serializer for {tp!r}: it is not a type msgspec can encode. "
            "Use a dataclass or msgspec.Struct, or opt in to pickle with PickleSerializer()"
        ) from None


def serializer_from_snapshot(
    snap: SerializerSnapshot, allow_pickle: bool = False
) -> TypeSerializer[Any]:
    """Rebuild a built-in serializer from the snapshot found in a checkpoint.

    Record types are rebuilt by importing their class by name; pickle only if ``allow_pickle``.
    A snapshot that describes no serializer this streamstate can rebuild (an unknown type, a
    malformed description: a checkpoint is input) raises
    :class:`~streamstate.errors.SerializerSnapshotError`; one that needs pickle,
    :class:`~streamstate.errors.PickleNotAllowedError`.
    """
    try:
        return _from_snapshot(snap, allow_pickle)
    except StateMigrationException:
        raise
    except TypeError as exc:
        raise SerializerSnapshotError(str(exc)) from None
    except (AttributeError, KeyError, ValueError, RecursionError) as exc:
        shown = repr(snap)
        raise SerializerSnapshotError(
            f"the checkpoint describes a serializer this streamstate cannot rebuild "
            f"({shown[:200]}{'...' if len(shown) > 200 else ''}: {type(exc).__name__} {exc})"
        ) from None


def _from_snapshot(snap: SerializerSnapshot, allow_pickle: bool) -> TypeSerializer[Any]:
    if not isinstance(snap, dict):
        raise TypeError(f"a serializer description in a checkpoint is a {type(snap).__name__}")
    t = snap.get("type")
    simple: dict[str, type[TypeSerializer[Any]]] = {
        "int64": Int64Serializer,
        "float64": Float64Serializer,
        "bool": BoolSerializer,
        "str": StrSerializer,
        "bytes": BytesSerializer,
        "void_namespace": VoidNamespaceSerializer,
    }
    if t in simple:
        return simple[t]()
    if t == "optional":
        return OptionalSerializer(serializer_from_snapshot(snap["inner"], allow_pickle))
    if t == "list":
        return ListSerializer(serializer_from_snapshot(snap["element"], allow_pickle))
    if t == "dict":
        return DictSerializer(
            serializer_from_snapshot(snap["key"], allow_pickle),
            serializer_from_snapshot(snap["value"], allow_pickle),
        )
    if t == "tuple":
        return TupleSerializer(*(serializer_from_snapshot(f, allow_pickle) for f in snap["fields"]))
    if t == "ttl_value":
        from streamstate.serializers.ttl import TtlValueSerializer

        return TtlValueSerializer(serializer_from_snapshot(snap["inner"], allow_pickle))
    if t == "pickle":
        if not allow_pickle:
            raise PickleNotAllowedError(
                "this state was written with PickleSerializer; reading it runs code stored in the "
                "checkpoint, so it is refused unless pickle is enabled explicitly"
            )
        return PickleSerializer()
    if t in ("time_window", "global_window"):
        # subclasses of StructSerializer with their own type: rebuilt as themselves, so that
        # their snapshot (and compatibility checks against it) stays the same
        from streamstate.serializers.window_namespaces import (
            GlobalWindowSerializer,
            TimeWindowSerializer,
        )

        return TimeWindowSerializer() if t == "time_window" else GlobalWindowSerializer()
    if t == "struct":
        return serializer_for(_record_type(str(snap.get("class", ""))))
    raise TypeError(f"unknown serializer type {t!r} in checkpoint")


#: modules a ``struct`` snapshot may name although the program has not imported them: the
#: standard library's, whose types msgspec encodes
SNAPSHOT_MODULES = frozenset({"datetime", "decimal", "uuid", "enum"})


def _record_type(name: str) -> type:
    """The record type ``module:qualname`` a checkpoint's snapshot names. A checkpoint must not
    make the program import code: the module must be one the program already imported (it
    declares the type, so it holds the class) or one of :data:`SNAPSHOT_MODULES`; and the name
    must lead to a class of that module, not to any other object."""
    import importlib
    import sys

    module, _, qual = name.partition(":")
    found: Any = sys.modules.get(module)
    if found is None and module in SNAPSHOT_MODULES:
        found = importlib.import_module(module)
    if found is None:
        raise TypeError(
            f"cannot rebuild the serializer of record type {name!r}: the checkpoint names module "
            f"{module!r}, which this program has not imported (a checkpoint never makes it "
            "import code); import the module first, or register the state with its descriptor"
        )
    try:
        for part in qual.split("."):
            found = getattr(found, part)
    except AttributeError:
        raise TypeError(
            f"cannot rebuild the serializer of record type {name!r}: module {module!r} has no "
            f"{qual!r}; register the state with its descriptor instead"
        ) from None
    if not (isinstance(found, type) and found.__module__ == module and found.__qualname__ == qual):
        raise TypeError(
            f"cannot rebuild the serializer of record type {name!r}: it names {found!r}, not a "
            f"class defined in {module!r}"
        )
    return found


class Types:
    """PyFlink-style type constructors, each returning a
    :class:`~streamstate.serializers.base.TypeSerializer`."""

    @staticmethod
    def LONG() -> TypeSerializer[Any]:  # noqa: N802 - PyFlink's spelling
        return Int64Serializer()

    INT = BIG_INT = SHORT = BYTE = LONG

    @staticmethod
    def DOUBLE() -> TypeSerializer[Any]:  # noqa: N802
        return Float64Serializer()

    FLOAT = DOUBLE

    @staticmethod
    def BOOLEAN() -> TypeSerializer[Any]:  # noqa: N802
        return BoolSerializer()

    @staticmethod
    def STRING() -> TypeSerializer[Any]:  # noqa: N802
        return StrSerializer()

    @staticmethod
    def BYTES() -> TypeSerializer[Any]:  # noqa: N802
        return BytesSerializer()

    @staticmethod
    def LIST(element: Any) -> TypeSerializer[Any]:  # noqa: N802
        return ListSerializer(serializer_for(element))

    @staticmethod
    def MAP(key: Any, value: Any) -> TypeSerializer[Any]:  # noqa: N802
        return DictSerializer(serializer_for(key), serializer_for(value))

    @staticmethod
    def TUPLE(fields: list[Any]) -> TypeSerializer[Any]:  # noqa: N802
        return TupleSerializer(*(serializer_for(f) for f in fields))

    @staticmethod
    def OPTIONAL(inner: Any) -> TypeSerializer[Any]:  # noqa: N802
        return OptionalSerializer(serializer_for(inner))

    @staticmethod
    def RECORD(cls: Any) -> TypeSerializer[Any]:  # noqa: N802
        return StructSerializer(cls)

    @staticmethod
    def PICKLED_BYTE_ARRAY() -> TypeSerializer[Any]:  # noqa: N802
        return PickleSerializer()
