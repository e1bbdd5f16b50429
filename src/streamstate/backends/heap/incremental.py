"""Change tracking for incremental checkpoints of the heap backend (SPEC §6.3).

With ``incremental=True`` every key group's :class:`StateMap` is an instance of a subclass of
the table's map class (:func:`tracking_map_class`) that records the ``(key, namespace)`` of each
write, clear and — for states whose values are mutable (lists, dicts, accumulators, records) —
each read, since the caller may mutate what it read in place. A checkpoint then captures, in its
synchronous phase, only the recorded entries: their current values (copied, so that later
in-place mutation cannot leak into the delta) or a tombstone when the entry is gone. The work is
proportional to what changed, not to the state's size.

The cost on the hot path is one extra Python frame and one ``list.append`` per write (of the key
alone in the default namespace, so nothing is allocated; of a ``(key, namespace)`` tuple
otherwise); reads cost nothing extra unless values are mutable. ``bench/checkpoint.py``
measures it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

from streamstate.backends.heap.nested_maps import NestedStateMap
from streamstate.backends.heap.state_map import StateMap, StateSnapshotTransformer
from streamstate.backends.snapshot import (
    DeltaEntries,
    EncodedEntries,
    EntryColumns,
    SnapshotSource,
    StateMetaInfo,
)
from streamstate.namespace import VOID_NAMESPACE

__all__ = [
    "MISSING",
    "DeltaSnapshotSource",
    "ReplaceDeltaSource",
    "TrackingStateMap",
    "capture_table_changes",
    "tracking_map_class",
]


class TrackingStateMap(StateMap):
    """Base of change-tracking maps: a subclass of a concrete map class made by
    :func:`tracking_map_class`, whose mutators record what they touch before doing their work.

    Changes are appended to lists (sequential memory, no hashing on the hot path) and
    de-duplicated when taken, or when a list grows past four times its distinct size (so memory
    stays bounded however long checkpoints are apart). Reads go straight to the map class's own
    methods unless values are mutable.

    >>> from streamstate.backends.heap.nested_maps import NestedStateMap
    >>> m = tracking_map_class(NestedStateMap, track_reads=False)()
    >>> m.put("k", VOID_NAMESPACE, 1); m.put("k", VOID_NAMESPACE, 2); m.remove("gone", "w1")
    >>> sorted(map(str, m.take_changes()))
    ["('gone', 'w1')", "('k', VOID_NAMESPACE)"]
    >>> m.get("k", VOID_NAMESPACE), m.take_changes(), m.has_changes()
    (2, [], False)
    """

    __slots__ = ()

    #: (key, namespace) of changes in namespaces other than VOID_NAMESPACE (may repeat)
    changed: list[tuple[Any, Any]]
    #: keys of changes in VOID_NAMESPACE (may repeat; no tuple allocated per change)
    changed_void: list[Any]
    _limit: int

    def has_changes(self) -> bool:
        return bool(self.changed_void) or bool(self.changed)

    def take_changes(self) -> list[tuple[Any, Any]]:
        """The recorded ``(key, namespace)`` pairs, once each; recording starts afresh."""
        void, changed = self.take_changes_split()
        out = [(k, VOID_NAMESPACE) for k in void]
        out.extend(changed)
        return out

    def take_changes_split(self) -> tuple[list[Any], list[tuple[Any, Any]]]:
        """The recorded keys in VOID_NAMESPACE and ``(key, namespace)`` pairs of the other
        namespaces, once each; recording starts afresh."""
        void, changed = self.changed_void, self.changed
        self.changed = []
        self.changed_void = []
        self._limit = _MIN_LIMIT
        return list(dict.fromkeys(void)), list(dict.fromkeys(changed))

    def _compact(self) -> None:
        self.changed_void = list(dict.fromkeys(self.changed_void))
        self.changed = list(dict.fromkeys(self.changed))
        self._limit = max(_MIN_LIMIT, 4 * (len(self.changed_void) + len(self.changed)))

    def untracked_get(self, key: Any, namespace: Any) -> Any:
        """Read without recording (the checkpoint's own reads)."""
        raise NotImplementedError

    def peek_many(self, keys: list[Any], namespace: Any) -> list[Any]:
        """The states of ``keys`` in ``namespace`` (:data:`MISSING` where there is no entry),
        without recording; NestedStateMap does it at C speed."""
        get, contains = self.untracked_get, self.contains
        out = []
        for k in keys:
            state = get(k, namespace)
            out.append(MISSING if state is None and not contains(k, namespace) else state)
        return out


_MIN_LIMIT = 1024

MISSING: Any = object()
"""Stands for "no entry" in :meth:`TrackingStateMap.peek_many` results."""

_CLASSES: dict[tuple[type, bool], type] = {}


def _nested_peek_many(self: Any, keys: list[Any], namespace: Any) -> list[Any]:
    by_key = self._maps.get(namespace)
    if by_key is None:
        return [MISSING] * len(keys)
    return list(map(by_key.get, keys, itertools.repeat(MISSING, len(keys))))


def tracking_map_class(base: type[StateMap], track_reads: bool) -> type[TrackingStateMap]:
    """A subclass of ``base`` that records the ``(key, namespace)`` of every write and clear
    (and of every read when ``track_reads``: values the caller may mutate in place)."""
    cached = _CLASSES.get((base, track_reads))
    if cached is not None:
        return cached  # type: ignore[return-value]
    void = VOID_NAMESPACE
    b_get, b_put, b_put_old = base.get, base.put, base.put_and_get_old
    b_remove, b_remove_old, b_transform = base.remove, base.remove_and_get_old, base.transform

    def mark(self: Any, key: Any, namespace: Any) -> None:
        if namespace is void:
            changes = self.changed_void
            changes.append(key)
        else:
            changes = self.changed
            changes.append((key, namespace))
        if len(changes) > self._limit:
            self._compact()

    class Tracking(TrackingStateMap, base):  # type: ignore[valid-type,misc]
        __slots__ = ("_limit", "changed", "changed_void")

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            base.__init__(self, *args, **kwargs)
            self.changed = []
            self.changed_void = []
            self._limit = _MIN_LIMIT

        untracked_get = b_get
        untracked_put = b_put
        untracked_remove = b_remove
        if base is NestedStateMap:
            peek_many = _nested_peek_many

        def put(self, key: Any, namespace: Any, state: Any) -> None:
            if namespace is void:
                changes = self.changed_void
                changes.append(key)
                if len(changes) > self._limit:
                    self._compact()
            else:
                mark(self, key, namespace)
            b_put(self, key, namespace, state)

        def put_and_get_old(self, key: Any, namespace: Any, state: Any) -> Any:
            mark(self, key, namespace)
            return b_put_old(self, key, namespace, state)

        def remove(self, key: Any, namespace: Any) -> None:
            mark(self, key, namespace)
            b_remove(self, key, namespace)

        def remove_and_get_old(self, key: Any, namespace: Any) -> Any:
            mark(self, key, namespace)
            return b_remove_old(self, key, namespace)

        def transform(
            self, key: Any, namespace: Any, value: Any, fn: Callable[[Any, Any], Any]
        ) -> None:
            if namespace is void:
                changes = self.changed_void
                changes.append(key)
                if len(changes) > self._limit:
                    self._compact()
            else:
                mark(self, key, namespace)
            b_transform(self, key, namespace, value, fn)

        if track_reads:

            def get(self, key: Any, namespace: Any) -> Any:
                if namespace is void:
                    changes = self.changed_void
                    changes.append(key)
                    if len(changes) > self._limit:
                        self._compact()
                else:
                    mark(self, key, namespace)
                return b_get(self, key, namespace)

    Tracking.__name__ = Tracking.__qualname__ = (
        f"{'ReadTracking' if track_reads else 'Tracking'}{base.__name__}"
    )
    _CLASSES[(base, track_reads)] = Tracking
    return Tracking  # type: ignore[no-any-return]


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
        if not isinstance(m, TrackingStateMap) or not m.has_changes():
            out.append(None)
            continue
        void_keys, pairs = m.take_changes_split()
        keys: list[Any] = []
        states: list[Any] = []
        gone_keys: list[Any] = []
        if void_keys:
            values = m.peek_many(void_keys, VOID_NAMESPACE)
            if transformer is None and MISSING not in values:
                keys, states = void_keys, values
            else:
                for k, v in zip(void_keys, values, strict=True):
                    if v is not MISSING and transformer is not None:
                        v = transformer(v)
                        if v is None:
                            v = MISSING
                    if v is MISSING:
                        gone_keys.append(k)
                    else:
                        keys.append(k)
                        states.append(v)
        namespaces: list[Any] = [VOID_NAMESPACE]
        gone_namespaces: list[Any] = [VOID_NAMESPACE]
        if pairs:
            namespaces = [VOID_NAMESPACE] * len(keys)
            gone_namespaces = [VOID_NAMESPACE] * len(gone_keys)
            get, contains = m.untracked_get, m.contains
            for k, ns in pairs:
                v = get(k, ns)
                if v is None and not contains(k, ns):
                    v = MISSING
                elif transformer is not None:
                    v = transformer(v)
                    if v is None:
                        v = MISSING
                if v is MISSING:
                    gone_keys.append(k)
                    gone_namespaces.append(ns)
                else:
                    keys.append(k)
                    namespaces.append(ns)
                    states.append(v)
        if copy is not None:
            states = [copy(v) for v in states]
        out.append(
            DeltaEntries(
                EntryColumns(keys, namespaces if keys else [], states),
                EntryColumns(gone_keys, gone_namespaces if gone_keys else [], None),
            )
        )
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
