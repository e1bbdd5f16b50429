"""What a window keeps: the ``window-contents`` state of the window operator (SPEC §9).

Process and apply functions keep every element (list state); reduce and aggregate functions keep
one pre-aggregated value (reducing / aggregating state). The element (or accumulator) type is
given to the builder or inferred: from ``create_accumulator()`` for aggregates, from the first
element otherwise.
"""

from __future__ import annotations

from typing import Any

from streamstate.api.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
)
from streamstate.api.functions import AggregateFunction
from streamstate.errors import StateAccessError
from streamstate.serializers import (
    BoolSerializer,
    BytesSerializer,
    DictSerializer,
    Float64Serializer,
    Int64Serializer,
    ListSerializer,
    StrSerializer,
    TupleSerializer,
    TypeSerializer,
    serializer_for,
    serializer_from_snapshot,
)
from streamstate.serializers.base import SerializerSnapshot

__all__ = ["WINDOW_CONTENTS", "WindowContents", "infer_serializer"]

WINDOW_CONTENTS = "window-contents"


def infer_serializer(value: Any) -> TypeSerializer[Any]:
    """A typed serializer for ``value``'s type, looking into tuples, lists and dicts.

    >>> infer_serializer(("a", 1, 2.5))
    TupleSerializer(fields=[...])
    """
    if isinstance(value, bool):
        return BoolSerializer()
    if isinstance(value, int):
        return Int64Serializer()
    if isinstance(value, float):
        return Float64Serializer()
    if isinstance(value, str):
        return StrSerializer()
    if isinstance(value, bytes):
        return BytesSerializer()
    if isinstance(value, tuple) and not hasattr(type(value), "_field_defaults"):
        # a plain tuple, or a Spark record (streamstate.spark.Row): stored as the tuple of its
        # fields (a named tuple, which has _field_defaults, keeps its class below)
        return TupleSerializer(*(infer_serializer(v) for v in value))
    if isinstance(value, list) and value:
        return ListSerializer(infer_serializer(value[0]))
    if isinstance(value, dict) and value:
        k, v = next(iter(value.items()))
        return DictSerializer(infer_serializer(k), infer_serializer(v))
    try:
        return serializer_for(type(value))
    except TypeError:
        raise TypeError(
            f"cannot infer a serializer for window elements like {value!r}; pass element_type= "
            "(or accumulator_type=) to the window function builder"
        ) from None


class WindowContents:
    """How a window's contents are kept: its state descriptor (built lazily when the element
    type is inferred from the first element) and whether it holds one pre-aggregated value."""

    __slots__ = ("element_type", "function", "kind")

    def __init__(self, kind: str, function: Any = None, element_type: Any = None) -> None:
        #: "list", "reducing" or "aggregating"
        self.kind = kind
        self.function = function
        self.element_type = element_type

    @property
    def single(self) -> bool:
        return self.kind != "list"

    def descriptor(self, first_element: Any = None, has_element: bool = False) -> StateDescriptor:
        t = self.element_type
        if self.kind == "aggregating":
            fn: AggregateFunction[Any, Any, Any] = self.function
            acc_type = t if t is not None else infer_serializer(fn.create_accumulator())
            return AggregatingStateDescriptor(WINDOW_CONTENTS, fn, acc_type)
        if t is None:
            if not has_element:
                raise StateAccessError(
                    f"the type of the window elements is not known yet; pass element_type= to "
                    f"the window builder (state {WINDOW_CONTENTS!r})"
                )
            t = infer_serializer(first_element)
        if self.kind == "reducing":
            return ReducingStateDescriptor(WINDOW_CONTENTS, self.function, t)
        return ListStateDescriptor(WINDOW_CONTENTS, t)

    def restored_descriptor(self, state_serializer: SerializerSnapshot) -> StateDescriptor | None:
        """The descriptor of contents restored from a checkpoint whose state serializer is
        ``state_serializer``, so that windows restored before any new element can fire; None if
        the element type cannot be rebuilt from it (it is then inferred as usual)."""
        if self.kind == "aggregating" or self.element_type is not None:
            return self.descriptor()
        try:
            restored = serializer_from_snapshot(state_serializer)
        except Exception:  # e.g. pickle, or a record class that no longer imports
            return None
        if self.kind == "reducing":
            return ReducingStateDescriptor(WINDOW_CONTENTS, self.function, restored)
        if not isinstance(restored, ListSerializer):
            return None
        return ListStateDescriptor(WINDOW_CONTENTS, restored.element)
