"""The nested-maps state map: ``dict[namespace][key] -> state`` (SPEC §5.1).

The simple baseline. Every operation is a dict operation; a snapshot copies every entry
synchronously (deep copy of mutable states), so processing stalls for O(entries) at each
checkpoint. Use it when checkpoints are rare or state is small; the copy-on-write map is the
default.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from streamstate.backends.heap.state_map import StateMap, StateMapSnapshot
from streamstate.serializers.base import TypeSerializer

__all__ = ["NestedStateMap", "NestedStateMapSnapshot"]


def _identity(x: Any) -> Any:
    return x


class NestedStateMapSnapshot(StateMapSnapshot):
    """A deep copy of a :class:`NestedStateMap` taken synchronously: one dict copy per namespace
    (C-speed copies; values copied one by one only when they are mutable)."""

    __slots__ = ("_maps", "_size")

    def __init__(self, maps: dict[Any, dict[Any, Any]], size: int) -> None:
        self._maps: dict[Any, dict[Any, Any]] | None = maps
        self._size = size

    def _check(self) -> dict[Any, dict[Any, Any]]:
        if self._maps is None:
            raise RuntimeError("this state map snapshot was already released")
        return self._maps

    def __iter__(self) -> Iterator[tuple[Any, Any, Any]]:
        for ns, m in self._check().items():
            for k, s in m.items():
                yield k, ns, s

    def columns(self) -> tuple[list[Any], list[Any], list[Any]]:
        """``(keys, namespaces, states)``; ``namespaces`` has one element when all entries
        share it."""
        maps = self._check()
        if len(maps) == 1:
            ((ns, m),) = maps.items()
            return list(m), [ns], list(m.values())
        keys: list[Any] = []
        namespaces: list[Any] = []
        states: list[Any] = []
        for ns, m in maps.items():
            keys.extend(m)
            namespaces.extend([ns] * len(m))
            states.extend(m.values())
        return keys, namespaces, states

    def __len__(self) -> int:
        return self._size if self._maps is not None else 0

    def release(self) -> None:
        self._maps = None


class NestedStateMap(StateMap):
    """``(key, namespace) -> state`` as two levels of dicts.

    >>> m = NestedStateMap()
    >>> m.put("k", "ns", 1); m.get("k", "ns"), len(m)
    (1, 1)

    Every operation is O(1) expected; :meth:`snapshot` is O(n) and runs synchronously.
    """

    __slots__ = ("_copy", "_maps", "_size")

    def __init__(self, serializer: TypeSerializer[Any] | None = None) -> None:
        self._maps: dict[Any, dict[Any, Any]] = {}
        self._size = 0
        if serializer is None or serializer.immutable:
            self._copy: Callable[[Any], Any] = _identity if serializer else _deepcopy
        else:
            self._copy = serializer.copy

    def get(self, key: Any, namespace: Any) -> Any:
        m = self._maps.get(namespace)
        return None if m is None else m.get(key)

    def contains(self, key: Any, namespace: Any) -> bool:
        m = self._maps.get(namespace)
        return m is not None and key in m

    def put(self, key: Any, namespace: Any, state: Any) -> None:
        m = self._maps.get(namespace)
        if m is None:
            m = self._maps[namespace] = {}
        if key not in m:
            self._size += 1
        m[key] = state

    def put_and_get_old(self, key: Any, namespace: Any, state: Any) -> Any:
        m = self._maps.get(namespace)
        if m is None:
            m = self._maps[namespace] = {}
        old = m.get(key)
        if old is None and key not in m:
            self._size += 1
        m[key] = state
        return old

    def remove(self, key: Any, namespace: Any) -> None:
        self.remove_and_get_old(key, namespace)

    def remove_and_get_old(self, key: Any, namespace: Any) -> Any:
        m = self._maps.get(namespace)
        if m is None or key not in m:
            return None
        old = m.pop(key)
        self._size -= 1
        if not m:
            del self._maps[namespace]
        return old

    def transform(
        self, key: Any, namespace: Any, value: Any, fn: Callable[[Any, Any], Any]
    ) -> None:
        m = self._maps.get(namespace)
        if m is None:
            m = self._maps[namespace] = {}
        if key in m:
            m[key] = fn(m[key], value)
        else:
            m[key] = fn(None, value)
            self._size += 1

    def put_all(self, keys: list[Any], namespaces: list[Any], states: list[Any]) -> None:
        """Bulk load: one ``dict.update`` per namespace (C speed)."""
        if len(namespaces) == 1 and len(keys) != 1:
            m = self._maps.get(namespaces[0])
            if m is None:
                m = self._maps[namespaces[0]] = {}
            before = len(m)
            m.update(zip(keys, states, strict=True))
            self._size += len(m) - before
            return
        super().put_all(keys, namespaces, states)

    def replace_states(self, convert: Callable[[list[Any]], list[Any]]) -> Callable[[], None]:
        """In place, one ``dict.update`` per namespace."""
        parts = [(m, list(m), convert(list(m.values()))) for m in self._maps.values()]

        def commit() -> None:
            for m, keys, states in parts:
                m.update(zip(keys, states, strict=True))

        return commit

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[tuple[Any, Any, Any]]:
        for ns, m in self._maps.items():
            for k, s in m.items():
                yield k, ns, s

    def keys(self, namespace: Any) -> Iterator[Any]:
        m = self._maps.get(namespace)
        return iter(()) if m is None else iter(list(m))

    def namespaces(self) -> Iterator[Any]:
        return iter(list(self._maps))

    def snapshot(self) -> NestedStateMapSnapshot:
        cp = self._copy
        if cp is _identity:
            maps = {ns: dict(m) for ns, m in self._maps.items()}
        else:
            maps = {ns: {k: cp(s) for k, s in m.items()} for ns, m in self._maps.items()}
        return NestedStateMapSnapshot(maps, self._size)


def _deepcopy(x: Any) -> Any:
    import copy

    return copy.deepcopy(x)
