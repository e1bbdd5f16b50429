"""Heap implementations of the five keyed state kinds (SPEC §5.3).

Each state is a thin handle over a :class:`StateTable`: it remembers its namespace and turns
the state interface into state-map operations on the current key. Lists and dicts are stored as
Python objects and mutated in place after a ``get`` (the copy-on-write map's ``get`` hands out a
private copy whenever the stored object is shared with a snapshot). List and map states keep
the table's count of their elements and mappings (``StateTable.elements``) as they change them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from streamstate._compiled import compiled
from streamstate.api.descriptors import (
    AggregatingStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateKind,
    ValueStateDescriptor,
)
from streamstate.api.state import (
    InternalAggregatingState,
    InternalListState,
    InternalMapState,
    InternalReducingState,
    InternalValueState,
)
from streamstate.backends.base import KeyContext, check_written_value, checked_list_elements
from streamstate.backends.heap.copy_on_write import (
    MIN_TRANSFERRED_PER_INCREMENTAL_REHASH,
    NO_HIT,
    NOT_REHASHING,
    CopyOnWriteStateMap,
    PyStateMapEntry,
    StateMapEntry,
)
from streamstate.backends.heap.incremental import tracking_map_class
from streamstate.backends.heap.state_table import StateTable
from streamstate.errors import StateAccessError
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers.base import TypeSerializer
from streamstate.serializers.inference import VoidNamespaceSerializer

#: what ``dict.pop`` returns for a user key the map does not hold
_ABSENT: Any = object()

__all__ = [
    "STATE_FACTORIES",
    "VALUE_STATE_TYPES",
    "CompiledHeapValueState",
    "HeapAggregatingState",
    "HeapListState",
    "HeapMapState",
    "HeapReducingState",
    "HeapValueState",
]


class _HeapState:
    """Shared fields of every heap state handle."""

    __slots__ = ("_ctx", "_descriptor", "_maps", "_ns", "_table", "_void", "namespace_serializer")

    def __init__(
        self,
        table: StateTable,
        descriptor: StateDescriptor,
        namespace_serializer: TypeSerializer[Any],
    ) -> None:
        self._table = table
        self._maps = table.maps
        self._ctx = table.ctx
        self._descriptor = descriptor
        self._ns: Any = VOID_NAMESPACE
        self.namespace_serializer = namespace_serializer
        self._void = isinstance(namespace_serializer, VoidNamespaceSerializer)

    @property
    def descriptor(self) -> StateDescriptor:
        return self._descriptor

    @property
    def table(self) -> StateTable:
        return self._table

    def set_current_namespace(self, namespace: Any) -> None:
        if namespace is None:
            raise StateAccessError(
                f"state {self._descriptor.name!r}: the namespace must not be None"
            )
        if self._void and namespace != VOID_NAMESPACE:
            # a checkpoint writes the namespace with the void serializer, which writes
            # nothing: every namespace would restore as one entry
            raise StateAccessError(
                f"state {self._descriptor.name!r} was registered with the void namespace "
                f"serializer and cannot be used in namespace {namespace!r}; pass a namespace "
                "serializer when the state is first requested"
            )
        self._ns = namespace

    def get_current_namespace(self) -> Any:
        return self._ns

    def clear(self) -> None:
        ctx = self._ctx
        self._maps[ctx.kg_index].remove(ctx.key, self._ns)

    def _name(self) -> str:
        return self._descriptor.name

    def _check(self, serializer: TypeSerializer[Any], value: Any, what: str = "value") -> None:
        check_written_value(serializer, value, self._descriptor.name, self._ctx.key, what)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._descriptor.name!r})"


class HeapValueState(_HeapState, InternalValueState[Any]):
    """A single value per (key, namespace). ``update(None)`` clears."""

    __slots__ = ("_copy_default", "_default", "_serializer", "_value_class")

    def __init__(
        self,
        table: StateTable,
        descriptor: ValueStateDescriptor,
        namespace_serializer: TypeSerializer[Any],
    ) -> None:
        super().__init__(table, descriptor, namespace_serializer)
        self._serializer = descriptor.serializer
        self._value_class = descriptor.serializer.value_class
        self._default = descriptor.default
        self._copy_default = descriptor.default is not None and not descriptor.serializer.immutable

    def value(self) -> Any:
        ctx = self._ctx
        v = self._maps[ctx.kg_index].get(ctx.key, self._ns)
        if v is None:
            if self._copy_default:
                return self._descriptor.serializer.copy(self._default)
            return self._default
        return v

    def update(self, value: Any) -> None:
        ctx = self._ctx
        if value is None:
            self._maps[ctx.kg_index].remove(ctx.key, self._ns)
        else:
            if value.__class__ is not self._value_class:
                self._check(self._serializer, value)
            self._maps[ctx.kg_index].put(ctx.key, self._ns, value)


class HeapListState(_HeapState, InternalListState[Any]):
    """A Python list per (key, namespace); ``None`` elements are refused."""

    __slots__ = ("_element", "_element_class")

    def __init__(
        self,
        table: StateTable,
        descriptor: StateDescriptor,
        namespace_serializer: TypeSerializer[Any],
    ) -> None:
        super().__init__(table, descriptor, namespace_serializer)
        self._element: TypeSerializer[Any] = descriptor.element_serializer  # type: ignore[attr-defined]
        self._element_class = self._element.value_class

    def get(self) -> list[Any]:
        ctx = self._ctx
        v = self._maps[ctx.kg_index].get(ctx.key, self._ns)
        return [] if v is None else v

    def get_internal(self) -> list[Any] | None:
        ctx = self._ctx
        return self._maps[ctx.kg_index].get(ctx.key, self._ns)  # type: ignore[no-any-return]

    def update_internal(self, values: list[Any] | None) -> None:
        ctx = self._ctx
        if values:
            old = self._maps[ctx.kg_index].put_and_get_old(ctx.key, self._ns, values)
            self._table.elements += len(values) - (0 if old is None else len(old))
        else:
            self.clear()

    def clear(self) -> None:
        ctx = self._ctx
        old = self._maps[ctx.kg_index].remove_and_get_old(ctx.key, self._ns)
        if old is not None:
            self._table.elements -= len(old)

    def add(self, value: Any) -> None:
        if value is None:
            raise StateAccessError(
                f"list state {self._descriptor.name!r}: None cannot be added to a list state"
            )
        if value.__class__ is not self._element_class:
            self._check(self._element, value, "element")
        ctx = self._ctx
        m = self._maps[ctx.kg_index]
        lst = m.get(ctx.key, self._ns)
        if lst is None:
            m.put(ctx.key, self._ns, [value])
        else:
            lst.append(value)
        self._table.elements += 1

    def _checked(self, values: Iterable[Any] | None) -> list[Any]:
        return checked_list_elements(values, self._element, self._descriptor.name, self._ctx.key)

    def add_all(self, values: Iterable[Any]) -> None:
        new = self._checked(values)
        if not new:
            return
        ctx = self._ctx
        m = self._maps[ctx.kg_index]
        lst = m.get(ctx.key, self._ns)
        if lst is None:
            m.put(ctx.key, self._ns, new)
        else:
            lst.extend(new)
        self._table.elements += len(new)

    def update(self, values: Iterable[Any] | None) -> None:
        self.update_internal(self._checked(values))

    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        ctx = self._ctx
        m = self._maps[ctx.kg_index]
        key = ctx.key
        merged: list[Any] | None = None
        for src in sources:
            part = m.remove_and_get_old(key, src)
            if part:
                merged = part if merged is None else merged + part
        if merged:
            m.transform(key, target, merged, _concat)


def _concat(current: list[Any] | None, more: list[Any]) -> list[Any]:
    if current is None:
        return more
    current.extend(more)
    return current


class HeapMapState(_HeapState, InternalMapState[Any, Any]):
    """A Python dict per (key, namespace); removing the last mapping removes the entry."""

    __slots__ = ("_key_class", "_key_serializer", "_value_class", "_value_serializer")

    def __init__(
        self,
        table: StateTable,
        descriptor: StateDescriptor,
        namespace_serializer: TypeSerializer[Any],
    ) -> None:
        super().__init__(table, descriptor, namespace_serializer)
        self._key_serializer: TypeSerializer[Any] = descriptor.key_serializer  # type: ignore[attr-defined]
        self._value_serializer: TypeSerializer[Any] = descriptor.value_serializer  # type: ignore[attr-defined]
        self._key_class = self._key_serializer.value_class
        self._value_class = self._value_serializer.value_class

    def _check_mapping(self, key: Any, value: Any) -> None:
        if key.__class__ is not self._key_class:
            self._check(self._key_serializer, key, "map key")
        if value is not None and value.__class__ is not self._value_class:
            self._check(self._value_serializer, value, "map value")

    def _map_or_none(self) -> dict[Any, Any] | None:
        ctx = self._ctx
        return self._maps[ctx.kg_index].get(ctx.key, self._ns)  # type: ignore[no-any-return]

    def get(self, key: Any) -> Any:
        d = self._map_or_none()
        return None if d is None else d.get(key)

    def put(self, key: Any, value: Any) -> None:
        if key.__class__ is not self._key_class or value.__class__ is not self._value_class:
            self._check_mapping(key, value)
        ctx = self._ctx
        m = self._maps[ctx.kg_index]
        d = m.get(ctx.key, self._ns)
        if d is None:
            m.put(ctx.key, self._ns, {key: value})
            self._table.elements += 1
        else:
            if key not in d:
                self._table.elements += 1
            d[key] = value

    def put_all(self, mapping: dict[Any, Any]) -> None:
        if not mapping:
            return
        for k, v in mapping.items():
            self._check_mapping(k, v)
        ctx = self._ctx
        m = self._maps[ctx.kg_index]
        d = m.get(ctx.key, self._ns)
        if d is None:
            d = dict(mapping)
            m.put(ctx.key, self._ns, d)
            self._table.elements += len(d)
        else:
            n = len(d)
            d.update(mapping)
            self._table.elements += len(d) - n

    def remove(self, key: Any) -> None:
        ctx = self._ctx
        m = self._maps[ctx.kg_index]
        d = m.get(ctx.key, self._ns)
        if d is None:
            return
        if d.pop(key, _ABSENT) is not _ABSENT:
            self._table.elements -= 1
        if not d:
            m.remove(ctx.key, self._ns)

    def contains(self, key: Any) -> bool:
        ctx = self._ctx
        # contains() on the state map never copies; only read the dict if the entry exists.
        d = self._maps[ctx.kg_index].get(ctx.key, self._ns)
        return d is not None and key in d

    def keys(self) -> Iterator[Any]:
        d = self._map_or_none()
        return iter(()) if d is None else iter(list(d))

    def values(self) -> Iterator[Any]:
        d = self._map_or_none()
        return iter(()) if d is None else iter(list(d.values()))

    def items(self) -> Iterator[tuple[Any, Any]]:
        d = self._map_or_none()
        return iter(()) if d is None else iter(list(d.items()))

    def is_empty(self) -> bool:
        ctx = self._ctx
        return not self._maps[ctx.kg_index].contains(ctx.key, self._ns)

    def clear(self) -> None:
        ctx = self._ctx
        old = self._maps[ctx.kg_index].remove_and_get_old(ctx.key, self._ns)
        if old is not None:
            self._table.elements -= len(old)


class HeapReducingState(_HeapState, InternalReducingState[Any]):
    """A value folded with the descriptor's reduce function; ``add(None)`` clears (as Flink)."""

    __slots__ = ("_reduce", "_serializer", "_value_class")

    def __init__(
        self,
        table: StateTable,
        descriptor: ReducingStateDescriptor,
        namespace_serializer: TypeSerializer[Any],
    ) -> None:
        super().__init__(table, descriptor, namespace_serializer)
        self._serializer = descriptor.serializer
        self._value_class = descriptor.serializer.value_class
        reduce = descriptor.reduce_function.reduce

        def transformation(previous: Any, value: Any) -> Any:
            return value if previous is None else reduce(previous, value)

        self._reduce = transformation

    def get(self) -> Any:
        ctx = self._ctx
        return self._maps[ctx.kg_index].get(ctx.key, self._ns)

    get_internal = get

    def update_internal(self, value: Any) -> None:
        ctx = self._ctx
        if value is None:
            self._maps[ctx.kg_index].remove(ctx.key, self._ns)
        else:
            self._maps[ctx.kg_index].put(ctx.key, self._ns, value)

    def add(self, value: Any) -> None:
        ctx = self._ctx
        if value is None:
            self._maps[ctx.kg_index].remove(ctx.key, self._ns)
            return
        if value.__class__ is not self._value_class:
            self._check(self._serializer, value)
        self._maps[ctx.kg_index].transform(ctx.key, self._ns, value, self._reduce)

    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        ctx = self._ctx
        m = self._maps[ctx.kg_index]
        key = ctx.key
        merged: Any = None
        for src in sources:
            part = m.remove_and_get_old(key, src)
            if part is not None:
                merged = part if merged is None else self._reduce(merged, part)
        if merged is not None:
            m.transform(key, target, merged, self._reduce)


class HeapAggregatingState(_HeapState, InternalAggregatingState[Any, Any]):
    """An accumulator folded with the descriptor's ``AggregateFunction``."""

    __slots__ = ("_add", "_agg", "_merge")

    def __init__(
        self,
        table: StateTable,
        descriptor: AggregatingStateDescriptor,
        namespace_serializer: TypeSerializer[Any],
    ) -> None:
        super().__init__(table, descriptor, namespace_serializer)
        agg = self._agg = descriptor.aggregate_function

        def add(acc: Any, value: Any) -> Any:
            if acc is None:
                acc = agg.create_accumulator()
            return agg.add(value, acc)

        def merge(acc: Any, other: Any) -> Any:
            return other if acc is None else agg.merge(acc, other)

        self._add = add
        self._merge = merge

    def get(self) -> Any:
        ctx = self._ctx
        acc = self._maps[ctx.kg_index].get(ctx.key, self._ns)
        return None if acc is None else self._agg.get_result(acc)

    def get_internal(self) -> Any:
        ctx = self._ctx
        return self._maps[ctx.kg_index].get(ctx.key, self._ns)

    def update_internal(self, value: Any) -> None:
        ctx = self._ctx
        if value is None:
            self._maps[ctx.kg_index].remove(ctx.key, self._ns)
        else:
            self._maps[ctx.kg_index].put(ctx.key, self._ns, value)

    def add(self, value: Any) -> None:
        ctx = self._ctx
        if value is None:  # as Flink's HeapAggregatingState: adding null clears
            self._maps[ctx.kg_index].remove(ctx.key, self._ns)
            return
        self._maps[ctx.kg_index].transform(ctx.key, self._ns, value, self._add)

    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        ctx = self._ctx
        m = self._maps[ctx.kg_index]
        key = ctx.key
        merged: Any = None
        for src in sources:
            part = m.remove_and_get_old(key, src)
            if part is not None:
                merged = part if merged is None else self._agg.merge(merged, part)
        if merged is not None:
            m.transform(key, target, merged, self._merge)


class CompiledHeapValueState(HeapValueState):
    """:class:`HeapValueState` whose ``value()`` and ``update()`` take their common path in C
    (``_value_state.c``: the current key's entry found and written without the two Python frames
    of each call, on a plain map or an incremental backend's change-tracking one) and call
    :class:`HeapValueState`'s methods for everything else. Used when the extension and the
    compiled map entry are built and ``STREAMSTATE_PURE_PYTHON`` is not set; both pass the same
    behavioural suite."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"HeapValueState({self._descriptor.name!r})"


def _bind_compiled_value_state() -> type[HeapValueState] | None:
    """Install the compiled methods on :class:`CompiledHeapValueState`; None when they are not
    built, ``STREAMSTATE_PURE_PYTHON`` is set, or the maps use the pure-Python entry."""
    module = compiled("streamstate.backends.heap._value_state")
    if module is None or StateMapEntry is PyStateMapEntry:
        return None
    value, update = module.bind(
        CompiledHeapValueState,
        CopyOnWriteStateMap,
        KeyContext,
        StateMapEntry,
        NOT_REHASHING,
        NO_HIT,
        MIN_TRANSFERRED_PER_INCREMENTAL_REHASH,
        HeapValueState.value,
        HeapValueState.update,
        # an incremental backend's maps: a Spark query's state hosts run on them
        tracking_map_class(CopyOnWriteStateMap, track_reads=False),
        tracking_map_class(CopyOnWriteStateMap, track_reads=True),
        VOID_NAMESPACE,
    )
    CompiledHeapValueState.value = value  # type: ignore[method-assign]
    CompiledHeapValueState.update = update  # type: ignore[method-assign]
    return CompiledHeapValueState


_COMPILED_VALUE_STATE = _bind_compiled_value_state()

#: the value state types this process can use: the pure-Python reference first, then the
#: compiled one when it is built (tests run the behavioural suite with each)
VALUE_STATE_TYPES: tuple[type[HeapValueState], ...] = (HeapValueState,) + (
    () if _COMPILED_VALUE_STATE is None else (_COMPILED_VALUE_STATE,)
)

STATE_FACTORIES: dict[StateKind, Any] = {
    StateKind.VALUE: VALUE_STATE_TYPES[-1],
    StateKind.LIST: HeapListState,
    StateKind.MAP: HeapMapState,
    StateKind.REDUCING: HeapReducingState,
    StateKind.AGGREGATING: HeapAggregatingState,
}
