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

The unsampled path of every operation is a countdown and the call of the decorated state's
method; see ``bench/metrics_overhead.py`` and ``docs/benchmarks.md`` for what that costs. With
the compiled countdown (``_sampling.c``, :data:`Sampled`), each operation of a decorator is an
instance attribute that counts down in C and calls the decorated state's bound method directly,
so the decorator adds no Python frame of its own; every ``sample_interval``-th call goes to the
operation's sampled method, generated from :data:`_SAMPLED_TEMPLATE`. Without it (not built,
or ``STREAMSTATE_PURE_PYTHON=1``), every operation's method is generated from one template
(:data:`_TEMPLATE`) and the table of operations (:data:`_OPERATIONS`): the countdown lives in a
slot of the decorator (``_get_left``, ...), read and written without a call or a dictionary
lookup. Both count, sample and record the same (the tests run with each).
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter_ns
from types import MethodType
from typing import Any, NamedTuple

from streamstate._compiled import compiled
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
    """Histograms of one operation of one state.

    The countdown to the next sampled call starts at 1, so that the first call is sampled, and is
    reset to ``interval`` after each sample; it lives in a slot of the decorator (``_get_left``,
    ...), one attribute load per call. ``left`` is the same countdown for callers without one.
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


def _record(hist: Histogram, serializer: TypeSerializer[Any] | None, value: Any) -> None:
    n = _size_of(serializer, value)
    if n is not None:
        hist.update(n)


class _Operation(NamedTuple):
    """One tracked operation of a state kind (a row of :data:`_OPERATIONS`)."""

    #: the state method
    method: str
    #: the metric's operation name (``<kind>_state_<name>_latency``); the decorator's slots are
    #: ``_<name>`` (the :class:`TrackedOperation`) and ``_<name>_left`` (the countdown)
    name: str
    #: the method's parameters after ``self``
    params: str = ""
    #: run before a sampled call (normalizes the arguments that are measured)
    prepare: str = ""
    #: value size: (the decorator's serializer attribute, the expression measured)
    value_size: tuple[str, str] | None = None
    #: key size: the expression measured with the decorator's ``_key`` serializer
    key_size: str | None = None
    #: whether the method returns the state's result (else None)
    returns: bool = True


_SAMPLED_BODY = """
    op = self._{name}
    {prepare}
    result = op.timed(self._original.{method}{args})
    {key_size}
    {value_size}
    return {result}
"""

_TEMPLATE = (
    """
def {method}(self{sig}):
    left = self._{name}_left - 1
    if left:
        self._{name}_left = left
        return self._original.{method}({params})
    self._{name}_left = self._interval"""
    + _SAMPLED_BODY
)
"""The one sampled method every operation is generated from: count down, and on the sampled
call time the decorated state's method and record the sizes."""

_SAMPLED_TEMPLATE = "\ndef {method}(self{sig}):" + _SAMPLED_BODY
"""The sampled call alone, for the compiled countdown (``_sampling.c``): it calls the decorated
state's bound method directly and this function every ``interval``-th time."""

_MERGE = _Operation("merge_namespaces", "merge_namespaces", "target, sources")
_CLEAR = _Operation("clear", "clear")
_LIST_ARG = "values = list(values) if values is not None else []"

_OPERATIONS: dict[str, tuple[_Operation, ...]] = {
    "value_state": (
        _Operation("value", "get", value_size=("_serializer", "result")),
        _Operation("update", "update", "value", value_size=("_serializer", "value"), returns=False),
        _CLEAR,
    ),
    "list_state": (
        _Operation("get", "get", value_size=("_list", "list(result)")),
        _Operation("add", "add", "value", value_size=("_element", "value"), returns=False),
        _Operation("add_all", "add_all", "values", _LIST_ARG, ("_list", "values"), returns=False),
        _Operation("update", "update", "values", _LIST_ARG, ("_list", "values"), returns=False),
        _MERGE,
        _CLEAR,
    ),
    "map_state": (
        _Operation("get", "get", "key", value_size=("_value", "result"), key_size="key"),
        _Operation(
            "put",
            "put",
            "key, value",
            value_size=("_value", "value"),
            key_size="key",
            returns=False,
        ),
        _Operation(
            "put_all", "put_all", "mapping", value_size=("_dict", "dict(mapping)"), returns=False
        ),
        _Operation("remove", "remove", "key", key_size="key", returns=False),
        _Operation("contains", "contains", "key", key_size="key"),
        _Operation("items", "entries_init"),
        _Operation("keys", "keys_init"),
        _Operation("values", "values_init"),
        _Operation("is_empty", "is_empty"),
        _CLEAR,
    ),
    "reducing_state": (
        _Operation("get", "get", value_size=("_serializer", "result")),
        _Operation("add", "add", "value", value_size=("_serializer", "value"), returns=False),
        _MERGE,
        _CLEAR,
    ),
    "aggregating_state": (
        _Operation("get", "get"),
        _Operation("add", "add", "value", returns=False),
        _MERGE,
        _CLEAR,
    ),
}
"""Per state kind (the metric prefix), its tracked operations."""


def _generate(op: _Operation, template: str = _TEMPLATE) -> Callable[..., Any]:
    key_size = value_size = ""
    if op.key_size is not None:
        key_size = f"if op.key_size is not None: _record(op.key_size, self._key, {op.key_size})"
    if op.value_size is not None:
        attr, expr = op.value_size
        value_size = f"if op.value_size is not None: _record(op.value_size, self.{attr}, {expr})"
    source = template.format(
        method=op.method,
        name=op.name,
        sig=f", {op.params}" if op.params else "",
        params=op.params,
        args=f", {op.params}" if op.params else "",
        prepare=op.prepare,
        key_size=key_size,
        value_size=value_size,
        result="result" if op.returns else "None",
    )
    namespace: dict[str, Any] = {"_record": _record}
    exec(compile(source, f"<metrics decorator: {op.method}>", "exec"), namespace)
    fn: Callable[..., Any] = namespace[op.method]
    fn.__doc__ = f"``{op.method}`` of the decorated state, sampled (metric ``{op.name}``)."
    return fn


def _methods(prefix: str) -> dict[str, Callable[..., Any]]:
    return {op.method: _generate(op) for op in _OPERATIONS[prefix]}


def _sampled_methods(prefix: str) -> dict[str, Callable[..., Any]]:
    return {op.method: _generate(op, _SAMPLED_TEMPLATE) for op in _OPERATIONS[prefix]}


_sampling = compiled("streamstate.backends.decorators._sampling")
#: the compiled countdown (``Sampled(fast, sampled, interval)``), or None: the generated methods
Sampled: Any = None if _sampling is None else _sampling.Sampled


def _slots(prefix: str) -> tuple[str, ...]:
    return tuple(s for op in _OPERATIONS[prefix] for s in (f"_{op.name}", f"_{op.name}_left"))


class _MetricsTrackingState:
    """Shared fields and pass-through methods of the metrics decorators; each subclass is one
    state kind, its sampled methods generated from :data:`_OPERATIONS`."""

    # __dict__: with the compiled countdown, each operation is an instance attribute (a
    # ``Sampled``), found before the class's generated method of the same name
    __slots__ = ("__dict__", "_descriptor", "_group", "_interval", "_original")

    _prefix = ""
    #: the sampled calls alone, per method (used with the compiled countdown)
    _sampled: dict[str, Callable[..., Any]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Give a state kind's decorator (``_prefix``) its generated methods, one per row of
        :data:`_OPERATIONS` (before ``ABCMeta`` checks them), and their sampled calls."""
        super().__init_subclass__(**kwargs)
        for method, fn in _methods(cls._prefix).items():
            setattr(cls, method, fn)
        cls._sampled = _sampled_methods(cls._prefix)

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
        self._set_serializers(descriptor)
        for op in _OPERATIONS[self._prefix]:
            tracked = self._op(
                op.name,
                interval,
                history,
                latency,
                size,
                value_size=op.value_size is not None,
                key_size=op.key_size is not None,
            )
            setattr(self, f"_{op.name}", tracked)
            setattr(self, f"_{op.name}_left", 1)  # the first call of each operation is sampled
        if Sampled is not None:
            # the unsampled call goes from C straight to the decorated state: no Python frame
            # of the decorator's own (the generated methods stay, for STREAMSTATE_PURE_PYTHON)
            sampled = self._sampled
            for op in _OPERATIONS[self._prefix]:
                self.__dict__[op.method] = Sampled(
                    getattr(original, op.method),
                    MethodType(sampled[op.method], self),
                    interval,
                )

    def _set_serializers(self, descriptor: Any) -> None:
        """Keep the serializers the size histograms measure with."""

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

    def get_internal(self) -> Any:
        return self._original.get_internal()

    def update_internal(self, value: Any) -> None:
        self._original.update_internal(value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._original!r})"


class MetricsTrackingValueState(_MetricsTrackingState, InternalValueState[Any]):
    __slots__ = (*_slots("value_state"), "_serializer")
    _prefix = "value_state"

    def _set_serializers(self, descriptor: Any) -> None:
        self._serializer = descriptor.serializer


class MetricsTrackingListState(_MetricsTrackingState, InternalListState[Any]):
    __slots__ = (*_slots("list_state"), "_element", "_list")
    _prefix = "list_state"

    def _set_serializers(self, descriptor: Any) -> None:
        self._element = descriptor.element_serializer
        self._list = ListSerializer(descriptor.element_serializer)


class MetricsTrackingMapState(_MetricsTrackingState, InternalMapState[Any, Any]):
    __slots__ = (*_slots("map_state"), "_dict", "_key", "_value")
    _prefix = "map_state"

    def _set_serializers(self, descriptor: Any) -> None:
        self._key = descriptor.key_serializer
        self._value = descriptor.value_serializer
        self._dict = descriptor.serializer


class MetricsTrackingReducingState(_MetricsTrackingState, InternalReducingState[Any]):
    __slots__ = (*_slots("reducing_state"), "_serializer")
    _prefix = "reducing_state"

    def _set_serializers(self, descriptor: Any) -> None:
        self._serializer = descriptor.serializer


class MetricsTrackingAggregatingState(_MetricsTrackingState, InternalAggregatingState[Any, Any]):
    __slots__ = _slots("aggregating_state")
    _prefix = "aggregating_state"


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
