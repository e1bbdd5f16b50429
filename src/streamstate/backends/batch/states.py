"""The five keyed state kinds holding the state of one key (Flink's ``BatchExecutionKey*State``).

In batch execution the records reach a subtask grouped by key, so a state only ever holds the
current key's values: one value per namespace. The value of the current namespace sits in a slot
of the state object itself (a state access reads or writes an attribute, no map lookup, no key
group, no copy-on-write version); the other namespaces of the key (windows) wait in a dict until
they become current again. When the key changes, the backend drops every value
(:meth:`BatchState.drop_key`).

Semantics are the heap backend's (``backends/heap/states.py``): ``None`` is "absent", lists and
dicts are stored as Python objects and handed out as they are, removing the last mapping of a map
removes the entry, ``add(None)`` clears a reducing or aggregating state, values whose class is not
the serializer's are checked when written.

While no key is set (before the first record, after the end of the input) a state's class is
swapped for its guard class (:func:`guard`), whose every access raises
:class:`~streamstate.errors.NoCurrentKeyError`: the hot path needs no ``if``.

>>> from streamstate.api.descriptors import ValueStateDescriptor
>>> from streamstate.backends.base import KeyContext
>>> from streamstate.serializers import VoidNamespaceSerializer
>>> ctx = KeyContext(1)
>>> s = BatchValueState(ctx, ValueStateDescriptor("n", int, default=0), VoidNamespaceSerializer())
>>> ctx.key = "a"
>>> s.update(s.value() + 1); s.value()
1
>>> s.drop_key(); s.value()
0

Complexity: every operation O(1) but ``set_current_namespace`` to another namespace (one dict
pop and one dict store), ``merge_namespaces`` (O(sources)) and the map iterators (O(mappings)).
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
from streamstate.errors import NoCurrentKeyError, StateAccessError
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers.base import TypeSerializer
from streamstate.serializers.inference import VoidNamespaceSerializer

__all__ = [
    "STATE_FACTORIES",
    "VALUE_STATE_TYPES",
    "BatchAggregatingState",
    "BatchListState",
    "BatchMapState",
    "BatchReducingState",
    "BatchState",
    "BatchValueState",
    "CompiledBatchValueState",
    "guard",
]


class BatchState:
    """Shared fields and namespace handling of every single-key state."""

    __slots__ = (
        "_ctx",
        "_descriptor",
        "_ns",
        "_others",
        "_value",
        "_void",
        "namespace_serializer",
    )

    #: the methods that touch values (the guard class makes each of them raise)
    DATA_METHODS: tuple[str, ...] = ("clear",)

    def __init__(
        self,
        ctx: KeyContext,
        descriptor: StateDescriptor,
        namespace_serializer: TypeSerializer[Any],
    ) -> None:
        self._ctx = ctx
        self._descriptor = descriptor
        self.namespace_serializer = namespace_serializer
        self._void = isinstance(namespace_serializer, VoidNamespaceSerializer)
        self._ns: Any = VOID_NAMESPACE
        #: the stored state of the current namespace (None: absent)
        self._value: Any = None
        #: the other namespaces of the current key with a stored state
        self._others: dict[Any, Any] = {}

    @property
    def descriptor(self) -> StateDescriptor:
        return self._descriptor

    def set_current_namespace(self, namespace: Any) -> None:
        current = self._ns
        if namespace is current:
            return
        if namespace is None:
            raise StateAccessError(
                f"state {self._descriptor.name!r}: the namespace must not be None"
            )
        if self._void and namespace != VOID_NAMESPACE:
            # a savepoint writes the namespace with the void serializer, which writes nothing
            raise StateAccessError(
                f"state {self._descriptor.name!r} was registered with the void namespace "
                f"serializer and cannot be used in namespace {namespace!r}; pass a namespace "
                "serializer when the state is first requested"
            )
        if namespace == current:
            return
        others = self._others
        if self._value is not None:
            others[current] = self._value
        self._value = others.pop(namespace, None)
        self._ns = namespace

    def get_current_namespace(self) -> Any:
        return self._ns

    def clear(self) -> None:
        self._value = None

    # ---- backend-facing ------------------------------------------------------------------------

    def drop_key(self) -> None:
        """Forget every value (the key changed); the current namespace stays."""
        self._value = None
        if self._others:
            self._others = {}

    def entries(self) -> list[tuple[Any, Any]]:
        """``(namespace, stored state)`` of every namespace of the current key."""
        out = list(self._others.items())
        if self._value is not None:
            out.append((self._ns, self._value))
        return out

    def __len__(self) -> int:
        """Namespaces of the current key with a stored state."""
        return len(self._others) + (self._value is not None)

    def has_namespace(self, namespace: Any) -> bool:
        if namespace == self._ns:
            return self._value is not None
        return namespace in self._others

    def _take(self, namespace: Any) -> Any:
        """Remove and return the stored state of ``namespace`` (None if absent)."""
        if namespace == self._ns:
            value, self._value = self._value, None
            return value
        return self._others.pop(namespace, None)

    def _peek(self, namespace: Any) -> Any:
        if namespace == self._ns:
            return self._value
        return self._others.get(namespace)

    def _store(self, namespace: Any, value: Any) -> None:
        if namespace == self._ns:
            self._value = value
        elif value is None:
            self._others.pop(namespace, None)
        else:
            self._others[namespace] = value

    def _check(self, serializer: TypeSerializer[Any], value: Any, what: str = "value") -> None:
        check_written_value(serializer, value, self._descriptor.name, self._ctx.key, what)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._descriptor.name!r})"


class BatchValueState(BatchState, InternalValueState[Any]):
    """A single value per namespace of the current key. ``update(None)`` clears."""

    __slots__ = ("_copy_default", "_default", "_serializer", "_value_class")

    DATA_METHODS = ("clear", "value", "update")

    def __init__(
        self,
        ctx: KeyContext,
        descriptor: ValueStateDescriptor,
        namespace_serializer: TypeSerializer[Any],
    ) -> None:
        super().__init__(ctx, descriptor, namespace_serializer)
        self._serializer = descriptor.serializer
        self._value_class = descriptor.serializer.value_class
        self._default = descriptor.default
        self._copy_default = descriptor.default is not None and not descriptor.serializer.immutable

    def value(self) -> Any:
        v = self._value
        if v is None:
            if self._copy_default:
                return self._serializer.copy(self._default)
            return self._default
        return v

    def update(self, value: Any) -> None:
        if value is not None and value.__class__ is not self._value_class:
            self._check(self._serializer, value)
        self._value = value


class BatchListState(BatchState, InternalListState[Any]):
    """A Python list per namespace of the current key; ``None`` elements are refused."""

    __slots__ = ("_element", "_element_class")

    DATA_METHODS = (
        "clear",
        "get",
        "add",
        "add_all",
        "update",
        "get_internal",
        "update_internal",
        "merge_namespaces",
    )

    def __init__(
        self,
        ctx: KeyContext,
        descriptor: StateDescriptor,
        namespace_serializer: TypeSerializer[Any],
    ) -> None:
        super().__init__(ctx, descriptor, namespace_serializer)
        self._element: TypeSerializer[Any] = descriptor.element_serializer  # type: ignore[attr-defined]
        self._element_class = self._element.value_class

    def get(self) -> list[Any]:
        v = self._value
        return [] if v is None else v  # type: ignore[no-any-return]

    def get_internal(self) -> list[Any] | None:
        return self._value  # type: ignore[no-any-return]

    def update_internal(self, values: list[Any] | None) -> None:
        self._value = values or None

    def add(self, value: Any) -> None:
        if value is None:
            raise StateAccessError(
                f"list state {self._descriptor.name!r}: None cannot be added to a list state"
            )
        if value.__class__ is not self._element_class:
            self._check(self._element, value, "element")
        lst = self._value
        if lst is None:
            self._value = [value]
        else:
            lst.append(value)

    def _checked(self, values: Iterable[Any] | None) -> list[Any]:
        return checked_list_elements(values, self._element, self._descriptor.name, self._ctx.key)

    def add_all(self, values: Iterable[Any]) -> None:
        new = self._checked(values)
        if not new:
            return
        lst = self._value
        if lst is None:
            self._value = new
        else:
            lst.extend(new)

    def update(self, values: Iterable[Any] | None) -> None:
        self.update_internal(self._checked(values))

    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        merged: list[Any] | None = None
        for src in sources:
            part = self._take(src)
            if part:
                merged = part if merged is None else merged + part
        if merged:
            current = self._peek(target)
            if current is None:
                self._store(target, merged)
            else:
                current.extend(merged)


class BatchMapState(BatchState, InternalMapState[Any, Any]):
    """A Python dict per namespace of the current key; removing the last mapping removes it."""

    __slots__ = ("_key_class", "_key_serializer", "_value_class", "_value_serializer")

    DATA_METHODS = (
        "clear",
        "get",
        "put",
        "put_all",
        "remove",
        "contains",
        "keys",
        "values",
        "items",
        "is_empty",
    )

    def __init__(
        self,
        ctx: KeyContext,
        descriptor: StateDescriptor,
        namespace_serializer: TypeSerializer[Any],
    ) -> None:
        super().__init__(ctx, descriptor, namespace_serializer)
        self._key_serializer: TypeSerializer[Any] = descriptor.key_serializer  # type: ignore[attr-defined]
        self._value_serializer: TypeSerializer[Any] = descriptor.value_serializer  # type: ignore[attr-defined]
        self._key_class = self._key_serializer.value_class
        self._value_class = self._value_serializer.value_class

    def _check_mapping(self, key: Any, value: Any) -> None:
        if key.__class__ is not self._key_class:
            self._check(self._key_serializer, key, "map key")
        if value is not None and value.__class__ is not self._value_class:
            self._check(self._value_serializer, value, "map value")

    def get(self, key: Any) -> Any:
        d = self._value
        return None if d is None else d.get(key)

    def put(self, key: Any, value: Any) -> None:
        if key.__class__ is not self._key_class or value.__class__ is not self._value_class:
            self._check_mapping(key, value)
        d = self._value
        if d is None:
            self._value = {key: value}
        else:
            d[key] = value

    def put_all(self, mapping: dict[Any, Any]) -> None:
        if not mapping:
            return
        for k, v in mapping.items():
            self._check_mapping(k, v)
        d = self._value
        if d is None:
            self._value = dict(mapping)
        else:
            d.update(mapping)

    def remove(self, key: Any) -> None:
        d = self._value
        if d is None:
            return
        d.pop(key, None)
        if not d:
            self._value = None

    def contains(self, key: Any) -> bool:
        d = self._value
        return d is not None and key in d

    def keys(self) -> Iterator[Any]:
        d = self._value
        return iter(()) if d is None else iter(list(d))

    def values(self) -> Iterator[Any]:
        d = self._value
        return iter(()) if d is None else iter(list(d.values()))

    def items(self) -> Iterator[tuple[Any, Any]]:
        d = self._value
        return iter(()) if d is None else iter(list(d.items()))

    def is_empty(self) -> bool:
        return self._value is None


class BatchReducingState(BatchState, InternalReducingState[Any]):
    """A value folded with the descriptor's reduce function; ``add(None)`` clears (as Flink)."""

    __slots__ = ("_reduce", "_serializer", "_value_class")

    DATA_METHODS = ("clear", "get", "add", "get_internal", "update_internal", "merge_namespaces")

    def __init__(
        self,
        ctx: KeyContext,
        descriptor: ReducingStateDescriptor,
        namespace_serializer: TypeSerializer[Any],
    ) -> None:
        super().__init__(ctx, descriptor, namespace_serializer)
        self._serializer = descriptor.serializer
        self._value_class = descriptor.serializer.value_class
        self._reduce = descriptor.reduce_function.reduce

    def get(self) -> Any:
        return self._value

    get_internal = get

    def update_internal(self, value: Any) -> None:
        self._value = value

    def add(self, value: Any) -> None:
        if value is None:
            self._value = None
            return
        if value.__class__ is not self._value_class:
            self._check(self._serializer, value)
        current = self._value
        self._value = value if current is None else self._reduce(current, value)

    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        reduce = self._reduce
        merged: Any = None
        for src in sources:
            part = self._take(src)
            if part is not None:
                merged = part if merged is None else reduce(merged, part)
        if merged is not None:
            current = self._peek(target)
            self._store(target, merged if current is None else reduce(current, merged))


class BatchAggregatingState(BatchState, InternalAggregatingState[Any, Any]):
    """An accumulator folded with the descriptor's ``AggregateFunction``."""

    __slots__ = ("_agg",)

    DATA_METHODS = ("clear", "get", "add", "get_internal", "update_internal", "merge_namespaces")

    def __init__(
        self,
        ctx: KeyContext,
        descriptor: AggregatingStateDescriptor,
        namespace_serializer: TypeSerializer[Any],
    ) -> None:
        super().__init__(ctx, descriptor, namespace_serializer)
        self._agg = descriptor.aggregate_function

    def get(self) -> Any:
        acc = self._value
        return None if acc is None else self._agg.get_result(acc)

    def get_internal(self) -> Any:
        return self._value

    def update_internal(self, value: Any) -> None:
        self._value = value

    def add(self, value: Any) -> None:
        if value is None:  # as Flink's HeapAggregatingState: adding null clears
            self._value = None
            return
        agg = self._agg
        acc = self._value
        if acc is None:
            acc = agg.create_accumulator()
        self._value = agg.add(value, acc)

    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        agg = self._agg
        merged: Any = None
        for src in sources:
            part = self._take(src)
            if part is not None:
                merged = part if merged is None else agg.merge(merged, part)
        if merged is not None:
            current = self._peek(target)
            self._store(target, merged if current is None else agg.merge(current, merged))


class CompiledBatchValueState(BatchValueState):
    """:class:`BatchValueState` whose ``value()`` and ``update()`` are compiled
    (``backends/heap/_value_state.c``: the slot read or written without a Python frame) and call
    :class:`BatchValueState`'s methods for a default that must be copied or a value that must be
    checked. Used when the extension is built and ``STREAMSTATE_PURE_PYTHON`` is not set; both
    pass the same behavioural suite."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"BatchValueState({self._descriptor.name!r})"


def _bind_compiled_value_state() -> type[BatchValueState] | None:
    module = compiled("streamstate.backends.heap._value_state")
    if module is None:
        return None
    value, update = module.bind_single(
        CompiledBatchValueState, BatchValueState.value, BatchValueState.update
    )
    CompiledBatchValueState.value = value  # type: ignore[method-assign]
    CompiledBatchValueState.update = update  # type: ignore[method-assign]
    return CompiledBatchValueState


_COMPILED_VALUE_STATE = _bind_compiled_value_state()

#: the value state types this process can use: the pure-Python reference first, then the
#: compiled one when it is built (tests run the behavioural suite with each)
VALUE_STATE_TYPES: tuple[type[BatchValueState], ...] = (BatchValueState,) + (
    () if _COMPILED_VALUE_STATE is None else (_COMPILED_VALUE_STATE,)
)

STATE_FACTORIES: dict[StateKind, type[BatchState]] = {
    StateKind.VALUE: VALUE_STATE_TYPES[-1],
    StateKind.LIST: BatchListState,
    StateKind.MAP: BatchMapState,
    StateKind.REDUCING: BatchReducingState,
    StateKind.AGGREGATING: BatchAggregatingState,
}


def _no_current_key(name: str) -> Any:
    def fail(self: BatchState, *_: Any, **__: Any) -> Any:
        raise NoCurrentKeyError(
            f"state {self._descriptor.name!r} was accessed with no current key set; keyed state "
            f"can only be used while processing a record or timer of a key ({name}() outside "
            "one)"
        )

    fail.__name__ = name
    return fail


def _guard_class(cls: type[BatchState]) -> type[BatchState]:
    # same slots (none added), so an instance's class can be swapped back and forth
    guarded = type(f"NoCurrentKey{cls.__name__}", (cls,), {"__slots__": ()})
    for name in cls.DATA_METHODS:
        setattr(guarded, name, _no_current_key(name))
    return guarded


#: state class -> its guard class, and back
_GUARDS: dict[type, type] = {}
for _cls in {*STATE_FACTORIES.values(), *VALUE_STATE_TYPES}:
    _g = _guard_class(_cls)
    _GUARDS[_cls] = _g
    _GUARDS[_g] = _cls
_GUARD_CLASSES = frozenset(_GUARDS[c] for c in {*STATE_FACTORIES.values(), *VALUE_STATE_TYPES})


def guard(state: BatchState, on: bool) -> None:
    """Swap ``state`` to its guard class (``on``: no current key) or back.

    The class swap keeps a state access free of a "is a key set?" test: the backend swaps its
    states twice per run (before the first key, after the last), never per record.
    """
    cls = type(state)
    is_guarded = cls in _GUARD_CLASSES
    if on != is_guarded:
        state.__class__ = _GUARDS[cls]
