"""Latency and size tracking of keyed state operations, as decorators (SPEC §8).

:func:`wrap_with_metrics` is what :meth:`KeyedStateBackend.get_or_create_keyed_state` calls when
the state backend has ``latency_tracking`` or ``size_tracking`` on (both off by default). The
decorator sits outside TTL (raw → TTL → metrics) and samples each operation of each state on
its own: the 1st, 101st, 201st, ... call of ``value_state_get`` is measured (``sample_interval``
100), the others only count down. Every measurement goes into a histogram that keeps the last
``history_size`` (128) samples, in a sub-group named after the state of the backend's metric
group (the operator's ``state`` group; ``runtime_context.get_metrics_group()`` is its parent):

>>> from streamstate.metrics import MetricGroup
>>> from streamstate.api.descriptors import ValueStateDescriptor
>>> from streamstate.backends.heap.backend import HeapKeyedStateBackend
>>> from streamstate.keygroups import KeyGroupRange
>>> from streamstate.serializers import StrSerializer
>>> group = MetricGroup("state")
>>> backend = HeapKeyedStateBackend(StrSerializer(), 8, KeyGroupRange(0, 7),
...     latency_tracking=True, size_tracking=True, metric_group=group)
>>> backend.set_current_key("k")
>>> state = backend.get_partitioned_state("ns", None, ValueStateDescriptor("count", int))
>>> for i in range(250): state.update(i)
>>> group.metrics()["state.count.value_state_update_latency"].count  # calls 1, 101, 201
3
>>> group.metrics()["state.count.value_state_update_value_size"].statistics()["max"]
8

Names (``<kind>_state_<operation>_latency`` in nanoseconds, ``..._key_size`` /
``..._value_size`` in serialized bytes):

* value: ``get`` (``value()``), ``update``, ``clear``; sizes of ``get`` and ``update`` values.
* list: ``get``, ``add``, ``add_all``, ``update``, ``merge_namespaces``, ``clear``; value sizes
  of ``get`` (the list), ``add`` (the element), ``add_all`` and ``update`` (the lists).
* map: ``get``, ``put``, ``put_all``, ``remove``, ``contains``, ``entries_init`` (``items()``),
  ``keys_init``, ``values_init``, ``is_empty``, ``clear``; key sizes (the user key) of ``get``,
  ``put``, ``remove``, ``contains``; value sizes of ``get``, ``put``, ``put_all`` (the dict).
* reducing: ``get``, ``add``, ``merge_namespaces``, ``clear``; value sizes of ``get`` and ``add``.
* aggregating: ``get``, ``add``, ``merge_namespaces``, ``clear`` (no sizes: inputs and results
  have no declared serializer).

The unsampled path of every operation is one extra Python call and a countdown; see
``bench/metrics_overhead.py`` and ``docs/benchmarks.md`` for what that costs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from time import perf_counter_ns
from typing import Any

from streamstate.api.descriptors import StateDescriptor, StateKind
from streamstate.api.state import (
    InternalAggregatingState,
    InternalListState,
    InternalMapState,
    InternalReducingState,
    InternalValueState,
)
from streamstate.metrics import Histogram, MetricGroup
from streamstate.serializers import ListSerializer, TypeSerializer

__all__ = [
    "DEFAULT_HISTORY_SIZE",
    "DEFAULT_SAMPLE_INTERVAL",
    "MetricsTrackingAggregatingState",
    "MetricsTrackingListState",
    "MetricsTrackingMapState",
    "MetricsTrackingReducingState",
    "MetricsTrackingValueState",
    "TrackedOperation",
    "wrap_with_metrics",
]

DEFAULT_SAMPLE_INTERVAL = 100
DEFAULT_HISTORY_SIZE = 128


class TrackedOperation:
    """Histograms of one operation of one state (and a countdown for the rarely used ones).

    The countdown to the next sampled call starts at 1, so that the first call is sampled, and is
    reset to ``interval`` after each sample. Hot operations keep it in a slot of the decorator
    (``_get_left``, ...) instead of ``left`` here: one attribute load less per call.
    """

    __slots__ = ("interval", "key_size", "latency", "left", "value_size")

    def __init__(
        self,
        interval: int,
        latency: Histogram | None,
        value_size: Histogram | None = None,
        key_size: Histogram | None = None,
    ) -> None:
        self.interval = interval
        self.left = 1
        self.latency = latency
        self.value_size = value_size
        self.key_size = key_size

    def timed(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call ``fn(*args)`` (a sampled call), recording its latency if tracked."""
        hist = self.latency
        if hist is None:
            return fn(*args)
        t0 = perf_counter_ns()
        result = fn(*args)
        hist.update(perf_counter_ns() - t0)
        return result


def _size_of(serializer: TypeSerializer[Any] | None, value: Any) -> int | None:
    if serializer is None or value is None:
        return None
    try:
        return len(serializer.serialize(value))
    except Exception:  # a value the serializer refuses is reported by the state, not here
        return None


class _MetricsTrackingState:
    """Shared fields and pass-through methods of the metrics decorators."""

    __slots__ = ("_clear", "_clear_left", "_descriptor", "_group", "_interval", "_original")

    _prefix = ""
    _clear_left: int

    def __init__(
        self,
        original: Any,
        descriptor: StateDescriptor,
        group: MetricGroup,
        interval: int,
        history: int,
        latency: bool,
        size: bool,
    ) -> None:
        self._original = original
        self._descriptor = descriptor
        self._group = group
        self._interval = interval
        self._clear = self._op("clear", interval, history, latency, False)
        self._create_operations(interval, history, latency, size)
        # every countdown starts at 1: the first call of each operation is sampled
        for cls in type(self).__mro__:
            for slot in getattr(cls, "__slots__", ()):
                if slot.endswith("_left"):
                    setattr(self, slot, 1)

    def _create_operations(self, *cfg: Any) -> None:
        """Create the :class:`TrackedOperation` of each operation of the state kind."""

    def _op(
        self,
        name: str,
        interval: int,
        history: int,
        latency: bool,
        size: bool,
        *,
        value_size: bool = False,
        key_size: bool = False,
    ) -> TrackedOperation:
        base = f"{self._prefix}_{name}"
        group = self._group
        return TrackedOperation(
            interval,
            group.histogram(f"{base}_latency", history) if latency else None,
            group.histogram(f"{base}_value_size", history) if size and value_size else None,
            group.histogram(f"{base}_key_size", history) if size and key_size else None,
        )

    @property
    def descriptor(self) -> StateDescriptor:
        return self._descriptor

    @property
    def original(self) -> Any:
        """The decorated state."""
        return self._original

    @property
    def metric_group(self) -> MetricGroup:
        """The group holding this state's histograms."""
        return self._group

    def set_current_namespace(self, namespace: Any) -> None:
        self._original.set_current_namespace(namespace)

    def get_current_namespace(self) -> Any:
        return self._original.get_current_namespace()

    def clear(self) -> None:
        left = self._clear_left - 1
        if left:
            self._clear_left = left
            return self._original.clear()
        self._clear_left = self._interval
        op = self._clear
        return op.timed(self._original.clear)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._original!r})"


class MetricsTrackingValueState(_MetricsTrackingState, InternalValueState[Any]):
    __slots__ = ("_get", "_get_left", "_serializer", "_update", "_update_left")
    _prefix = "value_state"
    _get_left: int
    _update_left: int

    def _create_operations(self, *cfg: Any) -> None:
        descriptor: Any = self._descriptor
        self._serializer = descriptor.serializer
        self._get = self._op("get", *cfg, value_size=True)
        self._update = self._op("update", *cfg, value_size=True)

    def value(self) -> Any:
        left = self._get_left - 1
        if left:
            self._get_left = left
            return self._original.value()
        self._get_left = self._interval
        op = self._get
        v = op.timed(self._original.value)
        if op.value_size is not None and (n := _size_of(self._serializer, v)) is not None:
            op.value_size.update(n)
        return v

    def update(self, value: Any) -> None:
        left = self._update_left - 1
        if left:
            self._update_left = left
            return self._original.update(value)
        self._update_left = self._interval
        op = self._update
        op.timed(self._original.update, value)
        if op.value_size is not None and (n := _size_of(self._serializer, value)) is not None:
            op.value_size.update(n)
        return None


class _MergingMixin:
    __slots__ = ()

    _merge: TrackedOperation
    _merge_left: int
    _interval: int
    _original: Any

    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        left = self._merge_left - 1
        if left:
            self._merge_left = left  # type: ignore[misc]  # a slot of the concrete classes
            return self._original.merge_namespaces(target, sources)  # type: ignore[no-any-return]
        self._merge_left = self._interval  # type: ignore[misc]
        op = self._merge
        return op.timed(self._original.merge_namespaces, target, sources)  # type: ignore[no-any-return]

    def get_internal(self) -> Any:
        return self._original.get_internal()

    def update_internal(self, value: Any) -> None:
        self._original.update_internal(value)


class MetricsTrackingListState(_MergingMixin, _MetricsTrackingState, InternalListState[Any]):
    __slots__ = (
        "_add",
        "_add_all",
        "_add_all_left",
        "_add_left",
        "_element",
        "_get",
        "_get_left",
        "_list",
        "_merge",
        "_merge_left",
        "_update",
        "_update_left",
    )
    _prefix = "list_state"
    _add_all_left: int
    _add_left: int
    _get_left: int
    _merge_left: int
    _update_left: int

    def _create_operations(self, *cfg: Any) -> None:
        descriptor: Any = self._descriptor
        self._element = descriptor.element_serializer
        self._list = ListSerializer(descriptor.element_serializer)
        self._get = self._op("get", *cfg, value_size=True)
        self._add = self._op("add", *cfg, value_size=True)
        self._add_all = self._op("add_all", *cfg, value_size=True)
        self._update = self._op("update", *cfg, value_size=True)
        self._merge = self._op("merge_namespaces", *cfg)

    def get(self) -> list[Any]:
        left = self._get_left - 1
        if left:
            self._get_left = left
            return self._original.get()  # type: ignore[no-any-return]
        self._get_left = self._interval
        op = self._get
        v = op.timed(self._original.get)
        if op.value_size is not None and (n := _size_of(self._list, list(v))) is not None:
            op.value_size.update(n)
        return v  # type: ignore[no-any-return]

    def add(self, value: Any) -> None:
        left = self._add_left - 1
        if left:
            self._add_left = left
            return self._original.add(value)
        self._add_left = self._interval
        op = self._add
        op.timed(self._original.add, value)
        if op.value_size is not None and (n := _size_of(self._element, value)) is not None:
            op.value_size.update(n)
        return None

    def add_all(self, values: Iterable[Any]) -> None:
        left = self._add_all_left - 1
        if left:
            self._add_all_left = left
            return self._original.add_all(values)
        self._add_all_left = self._interval
        op = self._add_all
        values = list(values) if values is not None else []
        op.timed(self._original.add_all, values)
        if op.value_size is not None and (n := _size_of(self._list, values)) is not None:
            op.value_size.update(n)
        return None

    def update(self, values: Iterable[Any] | None) -> None:
        left = self._update_left - 1
        if left:
            self._update_left = left
            return self._original.update(values)
        self._update_left = self._interval
        op = self._update
        values = list(values) if values is not None else []
        op.timed(self._original.update, values)
        if op.value_size is not None and (n := _size_of(self._list, values)) is not None:
            op.value_size.update(n)
        return None


class MetricsTrackingMapState(_MetricsTrackingState, InternalMapState[Any, Any]):
    __slots__ = (
        "_contains",
        "_contains_left",
        "_dict",
        "_entries",
        "_get",
        "_get_left",
        "_is_empty",
        "_key",
        "_keys",
        "_put",
        "_put_all",
        "_put_all_left",
        "_put_left",
        "_remove",
        "_remove_left",
        "_value",
        "_values",
    )
    _prefix = "map_state"
    _contains_left: int
    _get_left: int
    _put_all_left: int
    _put_left: int
    _remove_left: int

    def _create_operations(self, *cfg: Any) -> None:
        descriptor: Any = self._descriptor
        self._key = descriptor.key_serializer
        self._value = descriptor.value_serializer
        self._dict = descriptor.serializer
        self._get = self._op("get", *cfg, key_size=True, value_size=True)
        self._put = self._op("put", *cfg, key_size=True, value_size=True)
        self._put_all = self._op("put_all", *cfg, value_size=True)
        self._remove = self._op("remove", *cfg, key_size=True)
        self._contains = self._op("contains", *cfg, key_size=True)
        self._entries = self._op("entries_init", *cfg)
        self._keys = self._op("keys_init", *cfg)
        self._values = self._op("values_init", *cfg)
        self._is_empty = self._op("is_empty", *cfg)

    def _key_size(self, op: TrackedOperation, key: Any) -> None:
        if op.key_size is not None and (n := _size_of(self._key, key)) is not None:
            op.key_size.update(n)

    def get(self, key: Any) -> Any:
        left = self._get_left - 1
        if left:
            self._get_left = left
            return self._original.get(key)
        self._get_left = self._interval
        op = self._get
        v = op.timed(self._original.get, key)
        self._key_size(op, key)
        if op.value_size is not None and (n := _size_of(self._value, v)) is not None:
            op.value_size.update(n)
        return v

    def put(self, key: Any, value: Any) -> None:
        left = self._put_left - 1
        if left:
            self._put_left = left
            return self._original.put(key, value)
        self._put_left = self._interval
        op = self._put
        op.timed(self._original.put, key, value)
        self._key_size(op, key)
        if op.value_size is not None and (n := _size_of(self._value, value)) is not None:
            op.value_size.update(n)
        return None

    def put_all(self, mapping: dict[Any, Any]) -> None:
        left = self._put_all_left - 1
        if left:
            self._put_all_left = left
            return self._original.put_all(mapping)
        self._put_all_left = self._interval
        op = self._put_all
        op.timed(self._original.put_all, mapping)
        if op.value_size is not None and (n := _size_of(self._dict, dict(mapping))) is not None:
            op.value_size.update(n)
        return None

    def remove(self, key: Any) -> None:
        left = self._remove_left - 1
        if left:
            self._remove_left = left
            return self._original.remove(key)
        self._remove_left = self._interval
        op = self._remove
        op.timed(self._original.remove, key)
        self._key_size(op, key)
        return None

    def contains(self, key: Any) -> bool:
        left = self._contains_left - 1
        if left:
            self._contains_left = left
            return self._original.contains(key)  # type: ignore[no-any-return]
        self._contains_left = self._interval
        op = self._contains
        found = op.timed(self._original.contains, key)
        self._key_size(op, key)
        return found  # type: ignore[no-any-return]

    def _iter(self, op: TrackedOperation, fn: Callable[[], Iterator[Any]]) -> Iterator[Any]:
        left = op.left - 1
        if left:
            op.left = left
            return fn()
        op.left = op.interval
        return op.timed(fn)  # type: ignore[no-any-return]

    def items(self) -> Iterator[tuple[Any, Any]]:
        return self._iter(self._entries, self._original.items)

    def keys(self) -> Iterator[Any]:
        return self._iter(self._keys, self._original.keys)

    def values(self) -> Iterator[Any]:
        return self._iter(self._values, self._original.values)

    def is_empty(self) -> bool:
        return self._iter(self._is_empty, self._original.is_empty)  # type: ignore[return-value]


class MetricsTrackingReducingState(
    _MergingMixin, _MetricsTrackingState, InternalReducingState[Any]
):
    __slots__ = ("_add", "_add_left", "_get", "_get_left", "_merge", "_merge_left", "_serializer")
    _prefix = "reducing_state"
    _add_left: int
    _get_left: int
    _merge_left: int

    def _create_operations(self, *cfg: Any) -> None:
        descriptor: Any = self._descriptor
        self._serializer = descriptor.serializer
        self._get = self._op("get", *cfg, value_size=True)
        self._add = self._op("add", *cfg, value_size=True)
        self._merge = self._op("merge_namespaces", *cfg)

    def get(self) -> Any:
        left = self._get_left - 1
        if left:
            self._get_left = left
            return self._original.get()
        self._get_left = self._interval
        op = self._get
        v = op.timed(self._original.get)
        if op.value_size is not None and (n := _size_of(self._serializer, v)) is not None:
            op.value_size.update(n)
        return v

    def add(self, value: Any) -> None:
        left = self._add_left - 1
        if left:
            self._add_left = left
            return self._original.add(value)
        self._add_left = self._interval
        op = self._add
        op.timed(self._original.add, value)
        if op.value_size is not None and (n := _size_of(self._serializer, value)) is not None:
            op.value_size.update(n)
        return None


class MetricsTrackingAggregatingState(
    _MergingMixin, _MetricsTrackingState, InternalAggregatingState[Any, Any]
):
    __slots__ = ("_add", "_add_left", "_get", "_get_left", "_merge", "_merge_left")
    _prefix = "aggregating_state"
    _add_left: int
    _get_left: int
    _merge_left: int

    def _create_operations(self, *cfg: Any) -> None:
        self._get = self._op("get", *cfg)
        self._add = self._op("add", *cfg)
        self._merge = self._op("merge_namespaces", *cfg)

    def get(self) -> Any:
        left = self._get_left - 1
        if left:
            self._get_left = left
            return self._original.get()
        self._get_left = self._interval
        op = self._get
        return op.timed(self._original.get)

    def add(self, value: Any) -> None:
        left = self._add_left - 1
        if left:
            self._add_left = left
            return self._original.add(value)
        self._add_left = self._interval
        op = self._add
        return op.timed(self._original.add, value)  # type: ignore[no-any-return]


_DECORATORS: dict[StateKind, type[_MetricsTrackingState]] = {
    StateKind.VALUE: MetricsTrackingValueState,
    StateKind.LIST: MetricsTrackingListState,
    StateKind.MAP: MetricsTrackingMapState,
    StateKind.REDUCING: MetricsTrackingReducingState,
    StateKind.AGGREGATING: MetricsTrackingAggregatingState,
}


def wrap_with_metrics(
    state: Any,
    descriptor: StateDescriptor,
    metric_group: MetricGroup | None,
    *,
    latency: bool = False,
    size: bool = False,
    sample_interval: int = DEFAULT_SAMPLE_INTERVAL,
    history_size: int = DEFAULT_HISTORY_SIZE,
) -> Any:
    """Wrap ``state`` with latency and/or size tracking; returns ``state`` itself if neither.

    Histograms go to ``metric_group.add_group(descriptor.name)`` (a fresh ``MetricGroup("state")``
    when the backend has no group; it is then reachable as ``wrapped.metric_group``).
    """
    if not (latency or size):
        return state
    if sample_interval < 1:
        raise ValueError(f"sample_interval must be >= 1, got {sample_interval}")
    if metric_group is None:
        metric_group = MetricGroup("state")
    group = metric_group.add_group(descriptor.name)
    cls = _DECORATORS[descriptor.kind]
    return cls(state, descriptor, group, sample_interval, history_size, latency, size)
