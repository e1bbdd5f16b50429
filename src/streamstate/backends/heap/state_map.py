"""The contract of one key group's ``(key, namespace) -> state`` map on the heap (SPEC §5.1).

A :class:`~streamstate.backends.heap.state_table.StateTable` holds one ``StateMap`` per key group
of its backend's range. Two implementations exist: the copy-on-write map (default; snapshots are
taken in O(buckets) and written while processing goes on) and the nested-maps map (plain dicts;
snapshots copy everything synchronously).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["StateMap", "StateMapSnapshot", "StateSnapshotTransformer"]

StateSnapshotTransformer = Callable[[Any], Any]
"""Applied to each state while a snapshot is written: returns the state to write, or ``None``
to drop the entry (TTL's full-snapshot cleanup uses this). It never mutates its argument."""


class StateMapSnapshot(ABC):
    """A read-only view of a :class:`StateMap` as it was when the snapshot was taken."""

    __slots__ = ()

    @abstractmethod
    def __iter__(self) -> Iterator[tuple[Any, Any, Any]]:
        """Yield ``(key, namespace, state)`` for every entry at snapshot time."""

    def iter_transformed(
        self, transformer: StateSnapshotTransformer | None
    ) -> Iterator[tuple[Any, Any, Any]]:
        """Like ``iter`` but with each state passed through ``transformer`` (dropped on None)."""
        if transformer is None:
            yield from self
            return
        for key, ns, state in self:
            out = transformer(state)
            if out is not None:
                yield key, ns, out

    @abstractmethod
    def __len__(self) -> int:
        """Number of entries at snapshot time."""

    @abstractmethod
    def release(self) -> None:
        """Tell the map this snapshot is no longer needed. Idempotent."""


class StateMap(ABC):
    """``(key, namespace) -> state`` for one key group. Keys and namespaces are never None."""

    __slots__ = ()

    @abstractmethod
    def get(self, key: Any, namespace: Any) -> Any:
        """The state of ``(key, namespace)``, or None. The caller may mutate what it gets."""

    @abstractmethod
    def contains(self, key: Any, namespace: Any) -> bool:
        """Whether ``(key, namespace)`` has an entry."""

    @abstractmethod
    def put(self, key: Any, namespace: Any, state: Any) -> None:
        """Map ``(key, namespace)`` to ``state``."""

    @abstractmethod
    def put_and_get_old(self, key: Any, namespace: Any, state: Any) -> Any:
        """Map ``(key, namespace)`` to ``state`` and return the previous state (or None)."""

    @abstractmethod
    def remove(self, key: Any, namespace: Any) -> None:
        """Remove the entry of ``(key, namespace)`` if any."""

    @abstractmethod
    def remove_and_get_old(self, key: Any, namespace: Any) -> Any:
        """Remove the entry of ``(key, namespace)`` and return its state (or None)."""

    @abstractmethod
    def transform(
        self, key: Any, namespace: Any, value: Any, fn: Callable[[Any, Any], Any]
    ) -> None:
        """Set the state to ``fn(old_state_or_None, value)``."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of entries."""

    @abstractmethod
    def __iter__(self) -> Iterator[tuple[Any, Any, Any]]:
        """Yield ``(key, namespace, state)`` of every entry (live: do not mutate meanwhile)."""

    def keys(self, namespace: Any) -> Iterator[Any]:
        """Keys that have an entry under ``namespace``."""
        return (k for k, ns, _ in self if ns == namespace)

    def put_all(self, keys: list[Any], namespaces: list[Any], states: list[Any]) -> None:
        """Bulk load (restore): ``put`` every ``(keys[i], namespaces[i], states[i])``;
        ``namespaces`` may hold a single namespace shared by all keys. Implementations may do
        it faster than one ``put`` per entry."""
        put = self.put
        if len(namespaces) == 1 and len(keys) != 1:
            ns = namespaces[0]
            for k, s in zip(keys, states, strict=True):
                put(k, ns, s)
        else:
            for k, ns, s in zip(keys, namespaces, states, strict=True):
                put(k, ns, s)

    def replace_states(self, convert: Callable[[list[Any]], list[Any]]) -> Callable[[], None]:
        """Prepare replacing every entry's state by its image under ``convert`` (applied to the
        column of all states at once: a restored state migrating to a new type); returns the
        step that makes the replacement, so that a caller converts every map before changing
        any. O(n); implementations may replace in place."""
        entries = list(self)
        states = convert([s for _, _, s in entries])

        def commit() -> None:
            put = self.put
            for (key, namespace, _), state in zip(entries, states, strict=True):
                put(key, namespace, state)

        return commit

    @abstractmethod
    def snapshot(self) -> StateMapSnapshot:
        """A consistent view of the current content; must be released when written."""
