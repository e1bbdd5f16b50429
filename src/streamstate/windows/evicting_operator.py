"""The window operator of windows with an evictor (Flink's ``EvictingWindowOperator``).

An evictor needs the individual elements at fire time, so, as in Flink, an evicting window keeps
the list of its elements whatever its function: the ``window-contents`` state is a list state of
``(timestamp, element)`` pairs (the timestamp is ``None`` when the record had none), also for
``reduce`` and ``aggregate``, whose function then runs over the list when the window fires:

1. the list is read and ``evictor.evict_before(elements, size, window, ctx)`` removes elements;
2. the window function runs over what is left (a reduce folds it, ``None`` when nothing is
   left; an aggregate adds it to a new accumulator);
3. ``evictor.evict_after`` runs, and the list as the evictors left it (elements removed,
   replaced or reordered) is written back to the state, on every firing.

Everything else (assigners, triggers, lateness, cleanup, session merges, which merge the lists)
is the :class:`WindowOperator`'s.
"""

from __future__ import annotations

from typing import Any

from streamstate.api.descriptors import ListStateDescriptor
from streamstate.errors import StateAccessError
from streamstate.serializers import (
    Int64Serializer,
    ListSerializer,
    OptionalSerializer,
    TupleSerializer,
    serializer_for,
    serializer_from_snapshot,
)
from streamstate.windows.contents import WINDOW_CONTENTS, infer_serializer
from streamstate.windows.evictors import Evictor, EvictorContext, TimestampedValue
from streamstate.windows.operator import WindowOperator

__all__ = ["EvictingWindowOperator"]


class _EvictorContext(EvictorContext):
    __slots__ = ("_op",)

    def __init__(self, op: WindowOperator) -> None:
        self._op = op

    def get_current_processing_time(self) -> int:
        return self._op.timer_service.current_processing_time()  # type: ignore[no-any-return]

    def get_metric_group(self) -> Any:
        return self._op.metric_group

    def get_current_watermark(self) -> int:
        return self._op.timer_service.current_watermark  # type: ignore[no-any-return]


class EvictingWindowOperator(WindowOperator):
    """A :class:`WindowOperator` whose windows keep their elements for an :class:`Evictor`;
    built by ``window(...).evictor(...)``."""

    def __init__(self, *args: Any, evictor: Evictor, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(evictor, Evictor):
            raise TypeError(f"expected an Evictor, got {evictor!r}")
        self.evictor = evictor

    def open(self, runtime_context: Any) -> None:
        self._evictor_ctx = _EvictorContext(self)
        super().open(runtime_context)

    def _element_type(self) -> Any:
        # an aggregate's type parameter is its accumulator's; the elements' is inferred
        return None if self.contents.kind == "aggregating" else self.contents.element_type

    def _contents_type_known(self) -> bool:
        return self._element_type() is not None

    def _restored_contents_descriptor(self, state_serializer: Any) -> Any:
        # the list of (timestamp, element) pairs whatever the window function's kind
        try:
            restored = serializer_from_snapshot(state_serializer)
        except Exception:  # e.g. pickle, or a record class that no longer imports
            return None
        if not isinstance(restored, ListSerializer):
            return None
        return ListStateDescriptor(WINDOW_CONTENTS, restored.element)

    def _stored_element(self, value: Any, timestamp: int | None) -> Any:
        return (timestamp, value)

    def _create_window_state(self, element: Any, has_element: bool) -> Any:
        t = self._element_type()
        if t is None:
            if not has_element:
                raise StateAccessError(
                    "the type of the window elements is not known yet; pass element_type= to "
                    f"the window builder (state {WINDOW_CONTENTS!r} of an evicting window)"
                )
            t = infer_serializer(element)
        else:
            t = serializer_for(t)
        descriptor = ListStateDescriptor(
            WINDOW_CONTENTS, TupleSerializer(OptionalSerializer(Int64Serializer()), t)
        )
        self._window_state = self._backend.get_or_create_keyed_state(
            self._window_serializer, descriptor
        )
        return self._window_state

    def _fire(self, key: Any, window: Any, state: Any) -> None:
        stored = state.get()
        if not stored:
            return  # an empty window does not fire (Flink: its list state is null)
        elements = [TimestampedValue(v, ts) for ts, v in stored]
        evictor, ctx = self.evictor, self._evictor_ctx
        evictor.evict_before(elements, len(elements), window, ctx)
        values = [e.value for e in elements]
        kind = self.contents.kind
        if kind == "reducing":
            contents: Any = None
            reduce = self.contents.function.reduce
            for i, v in enumerate(values):
                contents = v if i == 0 else reduce(contents, v)
        elif kind == "aggregating":
            fn = self.contents.function
            acc = fn.create_accumulator()
            for v in values:
                acc = fn.add(v, acc)
            contents = fn.get_result(acc)
        else:
            contents = values
        self._ctx.window = window
        result = self.window_function.process(key, window, self._fn_ctx, contents)
        self.emit_results(result)
        evictor.evict_after(elements, len(elements), window, ctx)
        # written back on every firing, as Flink does: an evictor may have removed, replaced or
        # reordered elements, and a count would not tell
        state.update([(e.timestamp, e.value) for e in elements])

    def __repr__(self) -> str:
        return (
            f"EvictingWindowOperator({self.assigner!r}, trigger={self.trigger!r}, "
            f"evictor={self.evictor!r}, allowed_lateness={self.allowed_lateness})"
        )
