"""RocksDB implementations of the five keyed state kinds (SPEC §10).

Each state is a thin handle, as in Flink: the backend hands it its column family, its cache, the
key layout and the shared :class:`CurrentKeyBytes`; the state turns the state interface into
cache and RocksDB operations on the composite key ``[key group][key][namespace]``.

Encodings (one column family per state):

=============  =================================================================================
value          ``ck -> serializer(value)``
list           ``ck -> ListSerializer(elements)``: one value per list, appended in the cache
               (read-modify-write on a miss). Measured against one RocksDB key per element in
               ``bench/rocksdb.py``; see ``docs/architecture.md`` for the choice.
map            ``ck + serializer(user key) -> serializer(value)``: one RocksDB key per mapping,
               iterated with ``seek`` to the prefix ``ck`` (prefix-free, see ``keys.py``)
reducing       ``ck -> serializer(reduced value)``
aggregating    ``ck -> serializer(accumulator)``
=============  =================================================================================

The hot path binds what it needs to locals, checks the current key by identity and rebuilds the
composite key only when the key or namespace changed.
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
from streamstate.backends.base import KeyContext
from streamstate.backends.rocksdb.cache import (
    ABSENT,
    MISS,
    MapCache,
    MapView,
    ValueCache,
    WriteBackCache,
)
from streamstate.backends.rocksdb.keys import KeyLayout
from streamstate.errors import NoCurrentKeyError, StateAccessError, StateBackendError
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
    """``[key group][key]`` of the backend's current key, computed once per key change.

    States compare ``ctx.key`` with :attr:`key` by identity; on a change the first state to notice
    calls :meth:`refresh`, which is also the record boundary of the write-back cache.
    """

    __slots__ = ("_cache", "_ctx", "_layout", "_start", "disposed", "key", "prefix")

    def __init__(self, ctx: KeyContext, layout: KeyLayout, cache: WriteBackCache, start: int):
        self._ctx = ctx
        self._layout = layout
        self._cache = cache
        self._start = start
        self.key: Any = _NO_KEY
        self.prefix = b""
        self.disposed = False

    def refresh(self, state_name: str) -> None:
        if self.disposed:
            raise StateBackendError(
                f"state {state_name!r}: this rocksdb keyed state backend was disposed"
            )
        ctx = self._ctx
        key = ctx.key
        if key is None:
            raise NoCurrentKeyError(
                f"state {state_name!r} was accessed with no current key set; keyed state can only "
                "be used while processing a record or timer of a key (or after set_current_key)"
            )
        self._cache.at_record_boundary()
        self.prefix = self._layout.key_prefix(ctx.kg_index + self._start, key)
        self.key = key

    def dispose(self) -> None:
        self.disposed = True
        self.key = _NO_KEY


class _RocksDBState:
    """Shared fields and the composite-key logic of every RocksDB state handle."""

    __slots__ = (
        "_ck",
        "_ck_prefix",
        "_ctx",
        "_current",
        "_descriptor",
        "_layout",
        "_name",
        "_ns",
        "_ns_bytes",
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
        self._ns: Any = VOID_NAMESPACE
        # serialized lazily: a state whose namespaces are windows is created in VOID_NAMESPACE
        self._ns_bytes: bytes | None = b"" if layout.ns_void else None
        self._ck = b""
        self._ck_prefix: bytes | None = None

    @property
    def descriptor(self) -> StateDescriptor:
        return self._descriptor

    def set_current_namespace(self, namespace: Any) -> None:
        if namespace is self._ns:
            return
        if namespace is None:
            raise StateAccessError(f"state {self._name!r}: the namespace must not be None")
        if namespace == self._ns and type(namespace) is type(self._ns):
            return
        self._ns = namespace
        self._ns_bytes = b"" if self._layout.ns_void else None
        self._ck_prefix = None

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

    def _rebuild(self, prefix: bytes) -> bytes:
        """The composite key for a new key prefix or namespace (the slow part of ``_key``)."""
        nsb = self._ns_bytes
        if nsb is None:
            nsb = self._ns_bytes = self._namespace_bytes(self._ns)
        self._ck = ck = prefix + nsb
        self._ck_prefix = prefix
        return ck

    def _key(self) -> bytes:
        """The composite key of the current key and namespace."""
        current = self._current
        if self._ctx.key is not current.key:
            current.refresh(self._name)
        prefix = current.prefix
        if self._ck_prefix is not prefix:
            return self._rebuild(prefix)
        return self._ck

    def _key_in(self, namespace: Any) -> bytes:
        """The composite key of the current key in another namespace."""
        current = self._current
        if self._ctx.key is not current.key:
            current.refresh(self._name)
        return current.prefix + self._namespace_bytes(namespace)

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

    def _load(self, ck: bytes) -> Any:
        v = self._entries.get(ck, MISS)
        if v is MISS:
            v = self._cache.load(ck)
        return v

    def _store(self, ck: bytes, value: Any) -> None:
        """Store an object the cache owns (or ABSENT to delete)."""
        self._entries[ck] = value
        self._dirty.add(ck)

    def clear(self) -> None:
        ck = self._key()
        self._entries[ck] = ABSENT
        self._dirty.add(ck)

    def get_internal(self) -> Any:
        """The stored object (read-only!) or None."""
        v = self._load(self._key())
        return None if v is ABSENT else v

    def update_internal(self, value: Any) -> None:
        """Replace the stored object (None deletes); the object is handed over to the state."""
        self._store(self._key(), ABSENT if value is None else value)

    def _merge(self, a: Any, b: Any) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        merged: Any = None
        for src in sources:
            ck = self._key_in(src)
            part = self._load(ck)
            if part is ABSENT:
                continue
            self._store(ck, ABSENT)
            merged = part if merged is None else self._merge(merged, part)
        if merged is None:
            return
        tck = self._key_in(target)
        current = self._load(tck)
        result = merged if current is ABSENT else self._merge(current, merged)
        self._store(tck, ABSENT if result is None else result)


class RocksDBValueState(_SingleValueState, InternalValueState[Any]):
    """A single value per (key, namespace). ``update(None)`` clears."""

    __slots__ = ("_copy_default", "_default")

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        descriptor = self._descriptor
        self._default = getattr(descriptor, "default", None)
        self._copy_default = self._default is not None and not descriptor.serializer.immutable

    def value(self) -> Any:
        current = self._current
        if self._ctx.key is not current.key:
            current.refresh(self._name)
        prefix = current.prefix
        ck = self._ck if self._ck_prefix is prefix else self._rebuild(prefix)
        v = self._entries.get(ck, MISS)
        if v is MISS:
            v = self._cache.load(ck)
        if v is ABSENT:
            if self._copy_default:
                return self._copy(self._default)
            return self._default
        return v if self._immutable else self._copy(v)

    def update(self, value: Any) -> None:
        current = self._current
        if self._ctx.key is not current.key:
            current.refresh(self._name)
        prefix = current.prefix
        ck = self._ck if self._ck_prefix is prefix else self._rebuild(prefix)
        if value is None:
            self._entries[ck] = ABSENT
        elif self._immutable:
            self._entries[ck] = value
        else:
            self._entries[ck] = self._copy(value)
        self._dirty.add(ck)


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

    __slots__ = ("_copy_element",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        element = self._descriptor.element_serializer  # type: ignore[attr-defined]
        self._copy_element = None if element.immutable else element.copy

    def get(self) -> list[Any]:
        v = self._load(self._key())
        if v is ABSENT:
            return []
        return self._copy(v)  # type: ignore[no-any-return]

    def add(self, value: Any) -> None:
        if value is None:
            raise StateAccessError(
                f"list state {self._name!r}: None cannot be added to a list state"
            )
        ck = self._key()
        lst = self._entries.get(ck, MISS)
        if lst is MISS:
            lst = self._cache.load(ck)
        if self._copy_element is not None:
            value = self._copy_element(value)
        if lst is ABSENT:
            self._entries[ck] = [value]
        else:
            lst.append(value)
        self._dirty.add(ck)

    def add_all(self, values: Iterable[Any]) -> None:
        new = _refuse_none(self._name, values)
        if not new:
            return
        if self._copy_element is not None:
            new = [self._copy_element(v) for v in new]
        ck = self._key()
        lst = self._load(ck)
        if lst is ABSENT:
            self._entries[ck] = new
        else:
            lst.extend(new)
        self._dirty.add(ck)

    def update(self, values: Iterable[Any] | None) -> None:
        new = _refuse_none(self._name, values)
        if self._copy_element is not None:
            new = [self._copy_element(v) for v in new]
        self._store(self._key(), new or ABSENT)

    def update_internal(self, value: Any) -> None:
        self._store(self._key(), value or ABSENT)

    def _merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        a.extend(b)
        return a


class RocksDBReducingState(_SingleValueState, InternalReducingState[Any]):
    """A value folded with the descriptor's reduce function; ``add(None)`` clears (as Flink)."""

    __slots__ = ("_reduce",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._reduce = self._descriptor.reduce_function.reduce  # type: ignore[attr-defined]

    def get(self) -> Any:
        v = self._load(self._key())
        if v is ABSENT:
            return None
        return v if self._immutable else self._copy(v)

    def add(self, value: Any) -> None:
        ck = self._key()
        if value is None:
            self._store(ck, ABSENT)
            return
        current = self._load(ck)
        result = value if current is ABSENT else self._reduce(current, value)
        self._store(ck, ABSENT if result is None else result)

    def _merge(self, a: Any, b: Any) -> Any:
        return self._reduce(a, b)


class RocksDBAggregatingState(_SingleValueState, InternalAggregatingState[Any, Any]):
    """An accumulator folded with the descriptor's ``AggregateFunction``."""

    __slots__ = ("_agg",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._agg = self._descriptor.aggregate_function  # type: ignore[attr-defined]

    def get(self) -> Any:
        acc = self._load(self._key())
        return None if acc is ABSENT else self._agg.get_result(acc)

    def add(self, value: Any) -> None:
        ck = self._key()
        acc = self._load(ck)
        agg = self._agg
        if acc is ABSENT:
            acc = agg.create_accumulator()
        result = agg.add(value, acc)
        self._store(ck, ABSENT if result is None else result)

    def _merge(self, a: Any, b: Any) -> Any:
        return self._agg.merge(a, b)


class RocksDBMapState(_RocksDBState, InternalMapState[Any, Any]):
    """A map per (key, namespace): one RocksDB key per mapping, cached in a :class:`MapView`.

    Removing the last mapping removes the entry (no RocksDB key with the prefix remains).
    Iteration returns a list taken at call time, so mappings may be removed while iterating.
    """

    __slots__ = ("_cache", "_copy_value", "_views")

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
        self._views = cache.views
        value_serializer = descriptor.value_serializer  # type: ignore[attr-defined]
        self._copy_value = None if value_serializer.immutable else value_serializer.copy

    def _view(self) -> tuple[bytes, MapView]:
        ck = self._key()
        view = self._views.get(ck)
        if view is None:
            view = self._cache.view(ck)
        return ck, view

    def _lookup(self, user_key: Any) -> Any:
        ck, view = self._view()
        v = view.items.get(user_key, MISS)
        if v is MISS:
            v = self._cache.load(view, ck, user_key)
        return v

    def get(self, key: Any) -> Any:
        v = self._lookup(key)
        if v is ABSENT:
            return None
        return v if self._copy_value is None else self._copy_value(v)

    def contains(self, key: Any) -> bool:
        return self._lookup(key) is not ABSENT

    def put(self, key: Any, value: Any) -> None:
        _, view = self._view()
        items = view.items
        n = len(items)
        items[key] = value if self._copy_value is None else self._copy_value(value)
        view.dirty.add(key)
        self._cache.count += len(items) - n

    def put_all(self, mapping: dict[Any, Any]) -> None:
        if not mapping:
            return
        _, view = self._view()
        items = view.items
        n = len(items)
        cp = self._copy_value
        for k, v in mapping.items():
            items[k] = v if cp is None else cp(v)
            view.dirty.add(k)
        self._cache.count += len(items) - n

    def remove(self, key: Any) -> None:
        _, view = self._view()
        items = view.items
        n = len(items)
        items[key] = ABSENT
        view.dirty.add(key)
        self._cache.count += len(items) - n

    def _all_items(self) -> list[tuple[Any, Any]]:
        ck, view = self._view()
        self._cache.load_all(view, ck)
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
        ck, view = self._view()
        for v in view.items.values():
            if v is not ABSENT:
                return False
        if view.complete:
            return True
        return not self._cache.first_stored_key(view, ck)

    def clear(self) -> None:
        ck, view = self._view()
        self._cache.load_all(view, ck)
        for uk, v in view.items.items():
            if v is not ABSENT:
                view.items[uk] = ABSENT
                view.dirty.add(uk)

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
