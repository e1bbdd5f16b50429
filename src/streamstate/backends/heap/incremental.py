"""Change tracking for incremental checkpoints of the heap backend (SPEC §6.3).

With ``incremental=True`` every key group's :class:`StateMap` is wrapped in a
:class:`TrackingStateMap` that records the ``(key, namespace)`` of each write, clear and — for
states whose values are mutable (lists, dicts, accumulators, records) — each read, since the
caller may mutate what it read in place. A checkpoint then captures, in its synchronous phase,
only the recorded entries: their current values (copied, so that later in-place mutation cannot
leak into the delta) or a tombstone when the entry is gone. The work is proportional to what
changed, not to the state's size.

The cost on the hot path is one extra method call and one ``set.add`` per state access; it is
measured by ``bench/checkpoint.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from streamstate.backends.heap.state_map import StateMap, StateMapSnapshot, StateSnapshotTransformer
from streamstate.backends.snapshot import (
    DeltaEntries,
    EncodedEntries,
    SnapshotSource,
    StateMetaInfo,
)

__all__ = [
    "DeltaSnapshotSource",
    "ReadTrackingStateMap",
    "ReplaceDeltaSource",
    "TrackingStateMap",
    "capture_table_changes",
    "tracking_map_factory",
]


class TrackingStateMap(StateMap):
    """A key group's map that records which entries changed since changes were last taken.

    >>> from streamstate.backends.heap.nested_maps import NestedStateMap
    >>> m = TrackingStateMap(NestedStateMap())
    >>> m.put("k", "ns", 1); m.remove("gone", "ns"); sorted(m.take_changes())
    [('gone', 'ns'), ('k', 'ns')]
    >>> m.get("k", "ns"), m.take_changes()
    (1, set())
    """

    __slots__ = (
        "_add",
        "_contains",
        "_get",
        "_put",
        "_put_old",
        "_remove",
        "_remove_old",
        "_transform",
        "changed",
        "inner",
    )

    def __init__(self, inner: StateMap) -> None:
        self.inner = inner
        self.changed: set[tuple[Any, Any]] = set()
        self._add = self.changed.add
        self._get = inner.get
        self._contains = inner.contains
        self._put = inner.put
        self._put_old = inner.put_and_get_old
        self._remove = inner.remove
        self._remove_old = inner.remove_and_get_old
        self._transform = inner.transform

    def take_changes(self) -> set[tuple[Any, Any]]:
        """The recorded ``(key, namespace)`` pairs; recording starts afresh."""
        changed = self.changed
        self.changed = set()
        self._add = self.changed.add
        return changed

    def get(self, key: Any, namespace: Any) -> Any:
        return self._get(key, namespace)

    def contains(self, key: Any, namespace: Any) -> bool:
        return self._contains(key, namespace)  # type: ignore[no-any-return]

    def put(self, key: Any, namespace: Any, state: Any) -> None:
        self._add((key, namespace))
        self._put(key, namespace, state)

    def put_and_get_old(self, key: Any, namespace: Any, state: Any) -> Any:
        self._add((key, namespace))
        return self._put_old(key, namespace, state)

    def remove(self, key: Any, namespace: Any) -> None:
        self._add((key, namespace))
        self._remove(key, namespace)

    def remove_and_get_old(self, key: Any, namespace: Any) -> Any:
        self._add((key, namespace))
        return self._remove_old(key, namespace)

    def transform(
        self, key: Any, namespace: Any, value: Any, fn: Callable[[Any, Any], Any]
    ) -> None:
        self._add((key, namespace))
        self._transform(key, namespace, value, fn)

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[tuple[Any, Any, Any]]:
        return iter(self.inner)

    def keys(self, namespace: Any) -> Iterator[Any]:
        return self.inner.keys(namespace)

    def snapshot(self) -> StateMapSnapshot:
        return self.inner.snapshot()

    def __getattr__(self, name: str) -> Any:
        # map-specific extras (namespaces(), ...) of the wrapped map
        return getattr(self.inner, name)


class ReadTrackingStateMap(TrackingStateMap):
    """Also records reads: for states whose values the caller may mutate in place."""

    __slots__ = ()

    def get(self, key: Any, namespace: Any) -> Any:
        self._add((key, namespace))
        return self._get(key, namespace)


def tracking_map_factory(
    factory: Callable[[], StateMap], mutable_values: bool
) -> Callable[[], StateMap]:
    """Wrap the maps ``factory`` makes; reads are tracked when values are mutable."""
    cls = ReadTrackingStateMap if mutable_values else TrackingStateMap
    return lambda: cls(factory())


def capture_table_changes(
    maps: Iterable[StateMap],
    copy: Callable[[Any], Any] | None,
    transformer: StateSnapshotTransformer | None,
) -> list[DeltaEntries | None]:
    """The changes of each key group's map since the last capture (synchronous phase).

    Values are copied with ``copy`` (None for immutable values) so that the delta is a consistent
    image even while processing goes on; ``transformer`` (TTL) may turn a value into a tombstone.
    """
    out: list[DeltaEntries | None] = []
    for m in maps:
        if not isinstance(m, TrackingStateMap) or not m.changed:
            out.append(None)
            continue
        changed = m.take_changes()
        inner = m.inner
        get = inner.get
        contains = inner.contains
        upserts: list[tuple[Any, Any, Any]] = []
        removed: list[tuple[Any, Any]] = []
        for key, ns in changed:
            state = get(key, ns)
            if state is None and not contains(key, ns):
                removed.append((key, ns))
                continue
            if transformer is not None:
                state = transformer(state)
                if state is None:
                    removed.append((key, ns))
                    continue
            upserts.append((key, ns, state if copy is None else copy(state)))
        out.append(DeltaEntries(upserts, removed))
    return out


class DeltaSnapshotSource(SnapshotSource):
    """The captured changes of one state, key group by key group."""

    __slots__ = ("_per_kg", "meta")

    def __init__(self, meta: StateMetaInfo, per_kg: list[DeltaEntries | None]) -> None:
        self.meta = meta
        self._per_kg = per_kg

    def entries(self, key_group_index: int) -> DeltaEntries | None:
        return self._per_kg[key_group_index]

    def release_key_group(self, key_group_index: int) -> None:
        self._per_kg[key_group_index] = None

    def release(self) -> None:
        self._per_kg = [None] * len(self._per_kg)


class ReplaceDeltaSource(SnapshotSource):
    """A full source presented as a delta that replaces every key group it has entries in
    (for snapshot participants that do not track changes)."""

    __slots__ = ("_source", "meta")

    def __init__(self, source: SnapshotSource) -> None:
        self._source = source
        self.meta = source.meta

    def entries(self, key_group_index: int) -> DeltaEntries | EncodedEntries:
        got = self._source.entries(key_group_index)
        if got is None:
            return DeltaEntries([], None)  # the key group may have had entries before
        if isinstance(got, DeltaEntries | EncodedEntries):
            return got  # encoded entries are written as a replacement too
        return DeltaEntries(got if isinstance(got, list) else list(got), None)

    def release_key_group(self, key_group_index: int) -> None:
        self._source.release_key_group(key_group_index)

    def release(self) -> None:
        self._source.release()
