"""RocksDB implementations of the five keyed state kinds (SPEC §10).

Each state is a thin handle, as in Flink: the backend hands it its cache (which owns the column
family and the key layout) and the shared :class:`CurrentKeyBytes`; the state turns the state
interface into cache operations on the current key group, key and namespace, and into RocksDB
reads of the composite key ``[key group][key][namespace]`` on a cache miss.

Encodings (one column family per state):

=============  =================================================================================
value          ``ck -> serializer(value)``
list           ``ck -> ListSerializer(elements)``: one value per list, appended in the cache
               (read-modify-write on a miss). Measured against one RocksDB key per element in
               ``bench/rocksdb.py``; ``docs/architecture.md`` explains the choice.
map            ``ck + serializer(user key) -> serializer(value)``: one RocksDB key per mapping,
               iterated with ``seek`` to the prefix ``ck`` (prefix-free, see ``keys.py``)
reducing       ``ck -> serializer(reduced value)``
aggregating    ``ck -> serializer(accumulator)``
=============  =================================================================================

The hot path is a list index and a dict lookup keyed by the key (or ``(key, namespace)``), like
the heap backend's; nothing is serialized on a cache hit.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from streamstate.api.descriptors import StateDescriptor, StateKind
from streamstate.api.state import (
    InternalAggregatingState,
    InternalListState,
    InternalMapState,
    InternalReducingState,
    InternalValueState,
)
from streamstate.backends.base import KeyContext, check_written_value
from streamstate.backends.rocksdb.cache import ABSENT, MISS, MapCache, MapView, ValueCache
from streamstate.backends.rocksdb.keys import KeyLayout
from streamstate.errors import NoCurrentKeyError, StateAccessError
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers.base import TypeSerializer

__all__ = [
    "STATE_FACTORIES",
    "CurrentKeyBytes",
    "RocksDBAggregatingState",
    "RocksDBListState",
    "RocksDBMapState",
    "RocksDBReducingState",
    "RocksDBValueState",
]

_NO_KEY: Any = object()


class CurrentKeyBytes:
    """``[key group][key]`` of the backend's current key, serialized on the first cache miss of
    a record and shared by every state of the backend."""

    __slots__ = ("_ctx", "_layout", "_prefix", "_start", "key")

    # ``_prefix`` is read directly by the states' hot paths when ``key`` is the current key

    def __init__(self, ctx: KeyContext, layout: KeyLayout, start: int) -> None:
        self._ctx = ctx
        self._layout = layout
        self._start = start
        self.key: Any = _NO_KEY
        self._prefix = b""

    def prefix(self, state_name: str) -> bytes:
        ctx = self._ctx
        key = ctx.key
        if key is not self.key:
            if key is None:
                raise NoCurrentKeyError(
                    f"state {state_name!r} was accessed with no current key set"
                )
            self._prefix = self._layout.key_prefix(ctx.kg_index + self._start, key)
            self.key = key
        return self._prefix


class _RocksDBState:
    """Shared fields of every RocksDB state handle: namespace, layout, current key."""

    __slots__ = (
        "_ctx",
        "_current",
        "_descriptor",
        "_layout",
        "_name",
        "_ns",
        "_ns_bytes",
        "_void",
        "namespace_serializer",
    )

    def __init__(
        self,
        descriptor: StateDescriptor,
        namespace_serializer: TypeSerializer[Any],
        layout: KeyLayout,
        current: CurrentKeyBytes,
        ctx: KeyContext,
    ) -> None:
        self._descriptor = descriptor
        self._name = descriptor.name
        self.namespace_serializer = namespace_serializer
        self._layout = layout
        self._current = current
        self._ctx = ctx
        self._void = layout.ns_void
        self._ns: Any = VOID_NAMESPACE
        # serialized lazily: a state whose namespaces are windows is created in VOID_NAMESPACE
        self._ns_bytes: bytes | None = b"" if self._void else None

    @property
    def descriptor(self) -> StateDescriptor:
        return self._descriptor

    def set_current_namespace(self, namespace: Any) -> None:
        if namespace is self._ns:
            return
        if namespace is None:
            raise StateAccessError(f"state {self._name!r}: the namespace must not be None")
        if self._void and namespace != VOID_NAMESPACE:
            # RocksDB stores the namespace serialized: the void serializer writes nothing, so
            # every namespace would share one entry
            raise StateAccessError(
                f"state {self._name!r} was registered with the void namespace serializer and "
                f"cannot be used in namespace {namespace!r}; pass a namespace serializer when the "
                "state is first requested"
            )
        self._ns = namespace
        self._ns_bytes = b"" if self._void else None

    def get_current_namespace(self) -> Any:
        return self._ns

    def _namespace_bytes(self, namespace: Any) -> bytes:
        try:
            return self._layout.namespace_bytes(namespace)
        except Exception as exc:
            raise StateAccessError(
                f"state {self._name!r}: namespace {namespace!r} cannot be written by "
                f"{self.namespace_serializer!r}: {exc}"
            ) from exc

    def _raw_key(self) -> bytes:
        """The composite key of the current key and namespace (for a RocksDB read)."""
        nsb = self._ns_bytes
        if nsb is None:
            nsb = self._ns_bytes = self._namespace_bytes(self._ns)
        return self._current.prefix(self._name) + nsb

    def _check(self, serializer: TypeSerializer[Any], value: Any, what: str = "value") -> None:
        check_written_value(serializer, value, self._name, self._ctx.key, what)

    def _cache_key(self, namespace: Any) -> Any:
        return self._ctx.key if self._void else (self._ctx.key, namespace)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._name!r})"


class _SingleValueState(_RocksDBState):
    """States stored as one value per (key, namespace), through a :class:`ValueCache`."""

    __slots__ = ("_cache", "_copy", "_dirty", "_entries", "_immutable")

    def __init__(
        self,
        descriptor: StateDescriptor,
        namespace_serializer: TypeSerializer[Any],
        layout: KeyLayout,
        current: CurrentKeyBytes,
        ctx: KeyContext,
        cache: ValueCache,
    ) -> None:
        super().__init__(descriptor, namespace_serializer, layout, current, ctx)
        self._cache = cache
        self._entries = cache.entries
        self._dirty = cache.dirty
        serializer = descriptor.serializer
        self._immutable = serializer.immutable
        self._copy = serializer.copy

    def _load(self) -> tuple[int, Any, Any]:
        """``(key group index, cache key, stored object or ABSENT)`` of the current entry."""
        ctx = self._ctx
        kgi = ctx.kg_index
        ck = ctx.key if self._void else (ctx.key, self._ns)
        v = self._entries[kgi].get(ck, MISS)
        if v is MISS:
            v = self._cache.load(kgi, ck, self._raw_key())
        return kgi, ck, v

    def _load_in(self, namespace: Any) -> tuple[int, Any, Any]:
        """As :meth:`_load`, in another namespace of the current key."""
        kgi = self._ctx.kg_index
        ck = self._cache_key(namespace)
        v = self._entries[kgi].get(ck, MISS)
        if v is MISS:
            raw_key = self._current.prefix(self._name) + self._namespace_bytes(namespace)
            v = self._cache.load(kgi, ck, raw_key)
        return kgi, ck, v

    def _store(self, kgi: int, ck: Any, value: Any) -> None:
        """Store an object the cache owns (or ABSENT to delete)."""
        d = self._entries[kgi]
        n = len(d)
        d[ck] = value
        if len(d) != n:
            self._cache.count += 1
        self._dirty.add((kgi, ck))

    def clear(self) -> None:
        ctx = self._ctx
        self._store(ctx.kg_index, ctx.key if self._void else (ctx.key, self._ns), ABSENT)

    def get_internal(self) -> Any:
        """The stored object (read-only!) or None."""
        v = self._load()[2]
        return None if v is ABSENT else v

    def update_internal(self, value: Any) -> None:
        """Replace the stored object (None deletes); the object is handed over to the state."""
        ctx = self._ctx
        ck = ctx.key if self._void else (ctx.key, self._ns)
        self._store(ctx.kg_index, ck, ABSENT if value is None else value)

    def _merge(self, a: Any, b: Any) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        merged: Any = None
        for src in sources:
            kgi, ck, part = self._load_in(src)
            if part is ABSENT:
                continue
            self._store(kgi, ck, ABSENT)
            merged = part if merged is None else self._merge(merged, part)
        if merged is None:
            return
        kgi, ck, current = self._load_in(target)
        result = merged if current is ABSENT else self._merge(current, merged)
        self._store(kgi, ck, ABSENT if result is None else result)


class RocksDBValueState(_SingleValueState, InternalValueState[Any]):
    """A single value per (key, namespace). ``update(None)`` clears."""

    __slots__ = ("_copy_default", "_default", "_serializer", "_value_class")

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        descriptor = self._descriptor
        self._serializer = descriptor.serializer
        self._value_class = descriptor.serializer.value_class
        self._default = getattr(descriptor, "default", None)
        self._copy_default = self._default is not None and not descriptor.serializer.immutable

    def value(self) -> Any:
        ctx = self._ctx
        kgi = ctx.kg_index
        key = ctx.key
        ck = key if self._void else (key, self._ns)
        v = self._entries[kgi].get(ck, MISS)
        if v is MISS:  # inlined _raw_key(): the miss path is hot when state exceeds the cache
            current = self._current
            prefix = current._prefix if key is current.key else current.prefix(self._name)
            nsb = self._ns_bytes
            if nsb is None:
                nsb = self._ns_bytes = self._namespace_bytes(self._ns)
            # inlined ValueCache.load (one frame less per miss)
            cache = self._cache
            raw = cache.raw_get(prefix + nsb)
            v = ABSENT if raw is None else cache.deserialize(raw)
            self._entries[kgi][ck] = v
            cache.count += 1
        if v is ABSENT:
            if self._copy_default:
                return self._copy(self._default)
            return self._default
        return v if self._immutable else self._copy(v)

    def update(self, value: Any) -> None:
        ctx = self._ctx
        kgi = ctx.kg_index
        ck = ctx.key if self._void else (ctx.key, self._ns)
        d = self._entries[kgi]
        n = len(d)
        if value is None:
            d[ck] = ABSENT
        else:
            if value.__class__ is not self._value_class:
                self._check(self._serializer, value)
            d[ck] = value if self._immutable else self._copy(value)
        if len(d) != n:
            self._cache.count += 1
        self._dirty.add((kgi, ck))


def _refuse_none(name: str, values: Iterable[Any] | None) -> list[Any]:
    if values is None:
        return []
    out = list(values)
    for v in out:
        if v is None:
            raise StateAccessError(f"list state {name!r}: None cannot be added to a list state")
    return out


class RocksDBListState(_SingleValueState, InternalListState[Any]):
    """A list per (key, namespace), stored as one RocksDB value and appended in the cache."""

    __slots__ = ("_copy_element", "_element", "_element_class")

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        element = self._descriptor.element_serializer  # type: ignore[attr-defined]
        self._element: TypeSerializer[Any] = element
        self._element_class = element.value_class
        self._copy_element = None if element.immutable else element.copy

    def _checked(self, values: Iterable[Any] | None) -> list[Any]:
        new = _refuse_none(self._name, values)
        cls = self._element_class
        for v in new:
            if v.__class__ is not cls:
                self._check(self._element, v, "element")
        return new

    def get(self) -> list[Any]:
        v = self._load()[2]
        if v is ABSENT:
            return []
        return self._copy(v)  # type: ignore[no-any-return]

    def add(self, value: Any) -> None:
        if value is None:
            raise StateAccessError(
                f"list state {self._name!r}: None cannot be added to a list state"
            )
        if value.__class__ is not self._element_class:
            self._check(self._element, value, "element")
        kgi, ck, lst = self._load()
        if self._copy_element is not None:
            value = self._copy_element(value)
        if lst is ABSENT:
            self._entries[kgi][ck] = [value]
        else:
            lst.append(value)
        self._dirty.add((kgi, ck))

    def add_all(self, values: Iterable[Any]) -> None:
        new = self._checked(values)
        if not new:
            return
        if self._copy_element is not None:
            new = [self._copy_element(v) for v in new]
        kgi, ck, lst = self._load()
        if lst is ABSENT:
            self._entries[kgi][ck] = new
        else:
            lst.extend(new)
        self._dirty.add((kgi, ck))

    def update(self, values: Iterable[Any] | None) -> None:
        new = self._checked(values)
        if self._copy_element is not None:
            new = [self._copy_element(v) for v in new]
        self.update_internal(new or None)

    def update_internal(self, value: Any) -> None:
        super().update_internal(value or None)

    def _merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        a.extend(b)
        return a


class RocksDBReducingState(_SingleValueState, InternalReducingState[Any]):
    """A value folded with the descriptor's reduce function; ``add(None)`` clears (as Flink)."""

    __slots__ = ("_reduce", "_serializer", "_value_class")

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._reduce = self._descriptor.reduce_function.reduce  # type: ignore[attr-defined]
        self._serializer = self._descriptor.serializer
        self._value_class = self._serializer.value_class

    def get(self) -> Any:
        v = self._load()[2]
        if v is ABSENT:
            return None
        return v if self._immutable else self._copy(v)

    def add(self, value: Any) -> None:
        if value is None:
            self.clear()
            return
        if value.__class__ is not self._value_class:
            self._check(self._serializer, value)
        kgi, ck, current = self._load()
        result = value if current is ABSENT else self._reduce(current, value)
        self._store(kgi, ck, ABSENT if result is None else result)

    def _merge(self, a: Any, b: Any) -> Any:
        return self._reduce(a, b)


class RocksDBAggregatingState(_SingleValueState, InternalAggregatingState[Any, Any]):
    """An accumulator folded with the descriptor's ``AggregateFunction``."""

    __slots__ = ("_agg",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._agg = self._descriptor.aggregate_function  # type: ignore[attr-defined]

    def get(self) -> Any:
        acc = self._load()[2]
        return None if acc is ABSENT else self._agg.get_result(acc)

    def add(self, value: Any) -> None:
        if value is None:
            # as Flink's heap backend (its RocksDB state would hand None to the user's add):
            # adding None clears, on every backend alike
            self.clear()
            return
        kgi, ck, acc = self._load()
        agg = self._agg
        if acc is ABSENT:
            acc = agg.create_accumulator()
        result = agg.add(value, acc)
        self._store(kgi, ck, ABSENT if result is None else result)

    def _merge(self, a: Any, b: Any) -> Any:
        return self._agg.merge(a, b)


class RocksDBMapState(_RocksDBState, InternalMapState[Any, Any]):
    """A map per (key, namespace): one RocksDB key per mapping, cached in a :class:`MapView`.

    Removing the last mapping removes the entry (no RocksDB key with the prefix remains).
    Iteration returns a list taken at call time, so mappings may be removed while iterating.
    """

    __slots__ = (
        "_cache",
        "_copy_value",
        "_dirty",
        "_entries",
        "_key_class",
        "_key_serializer",
        "_value_class",
        "_value_serializer",
    )

    def __init__(
        self,
        descriptor: StateDescriptor,
        namespace_serializer: TypeSerializer[Any],
        layout: KeyLayout,
        current: CurrentKeyBytes,
        ctx: KeyContext,
        cache: MapCache,
    ) -> None:
        super().__init__(descriptor, namespace_serializer, layout, current, ctx)
        self._cache = cache
        self._entries = cache.entries
        self._dirty = cache.dirty
        value_serializer = descriptor.value_serializer  # type: ignore[attr-defined]
        self._copy_value = None if value_serializer.immutable else value_serializer.copy
        self._key_serializer: TypeSerializer[Any] = descriptor.key_serializer  # type: ignore[attr-defined]
        self._value_serializer: TypeSerializer[Any] = value_serializer
        self._key_class = self._key_serializer.value_class
        self._value_class = value_serializer.value_class

    def _check_mapping(self, key: Any, value: Any) -> None:
        if key.__class__ is not self._key_class:
            self._check(self._key_serializer, key, "map key")
        if value is not None and value.__class__ is not self._value_class:
            self._check(self._value_serializer, value, "map value")

    def _view(self) -> tuple[int, Any, MapView]:
        ctx = self._ctx
        kgi = ctx.kg_index
        ck = ctx.key if self._void else (ctx.key, self._ns)
        view = self._entries[kgi].get(ck)
        if view is None:
            if ctx.key is None:  # pragma: no cover - the guard raised already
                raise NoCurrentKeyError(f"state {self._name!r}: no current key")
            view = self._cache.new_view(kgi, ck)
        return kgi, ck, view

    def _lookup(self, user_key: Any) -> Any:
        kgi, ck, view = self._view()
        v = view.items.get(user_key, MISS)
        if v is MISS:
            v = self._cache.load(kgi, ck, view, user_key)
        return v

    def get(self, key: Any) -> Any:
        v = self._lookup(key)
        if v is ABSENT:
            return None
        return v if self._copy_value is None else self._copy_value(v)

    def contains(self, key: Any) -> bool:
        return self._lookup(key) is not ABSENT

    def _write(self, kgi: int, ck: Any, view: MapView, mapping: dict[Any, Any]) -> None:
        items = view.items
        n = len(items)
        items.update(mapping)
        if view.dirty is None:
            view.dirty = set(mapping)
        else:
            view.dirty.update(mapping)
        self._cache.count += len(items) - n
        self._dirty.add((kgi, ck))

    def put(self, key: Any, value: Any) -> None:
        if key.__class__ is not self._key_class or value.__class__ is not self._value_class:
            self._check_mapping(key, value)
        kgi, ck, view = self._view()
        items = view.items
        n = len(items)
        items[key] = value if self._copy_value is None else self._copy_value(value)
        if view.dirty is None:
            view.dirty = {key}
        else:
            view.dirty.add(key)
        self._cache.count += len(items) - n
        self._dirty.add((kgi, ck))

    def put_all(self, mapping: dict[Any, Any]) -> None:
        if not mapping:
            return
        for k, v in mapping.items():
            self._check_mapping(k, v)
        cp = self._copy_value
        kgi, ck, view = self._view()
        self._write(
            kgi, ck, view, mapping if cp is None else {k: cp(v) for k, v in mapping.items()}
        )

    def remove(self, key: Any) -> None:
        kgi, ck, view = self._view()
        self._write(kgi, ck, view, {key: ABSENT})

    def _all_items(self) -> list[tuple[Any, Any]]:
        kgi, ck, view = self._view()
        self._cache.load_all(kgi, ck, view)
        cp = self._copy_value
        if cp is None:
            return [(k, v) for k, v in view.items.items() if v is not ABSENT]
        return [(k, cp(v)) for k, v in view.items.items() if v is not ABSENT]

    def keys(self) -> Iterator[Any]:
        return iter([k for k, _ in self._all_items()])

    def values(self) -> Iterator[Any]:
        return iter([v for _, v in self._all_items()])

    def items(self) -> Iterator[tuple[Any, Any]]:
        return iter(self._all_items())

    def is_empty(self) -> bool:
        kgi, ck, view = self._view()
        for v in view.items.values():
            if v is not ABSENT:
                return False
        if view.complete:
            return True
        return not self._cache.has_stored_mapping(kgi, ck, view)

    def clear(self) -> None:
        kgi, ck, view = self._view()
        self._cache.load_all(kgi, ck, view)
        present = {uk: ABSENT for uk, v in view.items.items() if v is not ABSENT}
        if present:
            self._write(kgi, ck, view, present)

    def get_internal(self) -> dict[Any, Any] | None:
        """The whole map as a dict (None when empty)."""
        return dict(self._all_items()) or None

    def update_internal(self, value: dict[Any, Any] | None) -> None:
        """Replace the whole map."""
        self.clear()
        if value:
            self.put_all(value)


STATE_FACTORIES: dict[StateKind, Any] = {
    StateKind.VALUE: RocksDBValueState,
    StateKind.LIST: RocksDBListState,
    StateKind.MAP: RocksDBMapState,
    StateKind.REDUCING: RocksDBReducingState,
    StateKind.AGGREGATING: RocksDBAggregatingState,
}
