# mypy: disable-error-code="misc"
# (the tracking mixins declare no slots: the concrete map classes that tracking_map_class builds
# add them, and mypy cannot see slots made at run time)
"""Change tracking for incremental checkpoints of the heap backend (SPEC §6.3).

With ``incremental=True`` every key group's :class:`StateMap` is an instance of a subclass of
the table's map class (:func:`tracking_map_class`) whose mutators record each write and clear —
and, for states whose values are mutable (lists, dicts, accumulators, records), each read, since
the caller may mutate what it read in place. A record is the key (and namespace) with the state
object the map now holds for it (or a tombstone). A checkpoint then captures, in its synchronous
phase, the last record of each changed entry and copies the values that are mutable, so the
delta is a consistent image while processing goes on. Capturing needs no lookup in the (large,
cache-cold) map: the work is proportional to what changed, not to the state's size.

The cost on the hot path is one extra Python frame and two ``list.append`` per write (no
allocation in the default namespace; one tuple otherwise); reads cost nothing extra unless values
are mutable. ``bench/checkpoint.py`` measures it.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterable
from typing import Any

from streamstate.backends.heap.state_map import StateMap, StateSnapshotTransformer
from streamstate.format.meta import StateMetaInfo
from streamstate.format.snapshot import DeltaEntries, EntryColumns, SnapshotSource
from streamstate.namespace import VOID_NAMESPACE

__all__ = [
    "LOOKUP",
    "MISSING",
    "DeltaSnapshotSource",
    "TrackingStateMap",
    "capture_table_changes",
    "tracking_map_class",
]

MISSING: Any = object()
"""Record of an entry that was removed."""
LOOKUP: Any = object()
"""Record of an entry whose new state must be read from the map at capture time
(``transform``: the map computes the state)."""

_MIN_LIMIT = 1024
_CLASSES: dict[tuple[type, bool], type] = {}


class TrackingStateMap(StateMap):
    """Base of change-tracking maps (see the module docstring).

    Records go to append-only lists (sequential memory, no hashing on the hot path); the last
    record of each entry wins when changes are taken. The lists are compacted once they exceed
    twice the map's size (and four times their distinct records), so memory stays bounded however
    far apart checkpoints are.

    >>> from streamstate.backends.heap.nested_maps import NestedStateMap
    >>> m = tracking_map_class(NestedStateMap, track_reads=False)()
    >>> m.put("k", VOID_NAMESPACE, 1); m.put("k", VOID_NAMESPACE, 2); m.remove("gone", "w1")
    >>> void, other = m.take_changes_split()
    >>> void, [(k, ns, v is MISSING) for (k, ns), v in other.items()]
    ({'k': 2}, [('gone', 'w1', True)])
    >>> m.get("k", VOID_NAMESPACE), m.has_changes()
    (2, False)
    """

    __slots__ = ()

    #: VOID_NAMESPACE records: keys and state objects (or MISSING / LOOKUP), in order
    void_keys: list[Any]
    void_states: list[Any]
    #: records of other namespaces: (key, namespace) and state objects
    pairs: list[tuple[Any, Any]]
    pair_states: list[Any]
    #: a MISSING or LOOKUP record was made since changes were last taken
    special: bool
    _limit: int

    def has_changes(self) -> bool:
        return bool(self.void_keys) or bool(self.pairs)

    def take_changes_split(self) -> tuple[dict[Any, Any], dict[tuple[Any, Any], Any]]:
        """The last record of each changed entry — ``{key: state}`` for VOID_NAMESPACE and
        ``{(key, namespace): state}`` for the others; recording starts afresh."""
        void = dict(zip(self.void_keys, self.void_states, strict=True))
        other = dict(zip(self.pairs, self.pair_states, strict=True))
        self.void_keys, self.void_states, self.pairs, self.pair_states = [], [], [], []
        self._limit = _MIN_LIMIT
        self.special = False
        return void, other

    def take_changes(self) -> list[tuple[Any, Any]]:
        """The ``(key, namespace)`` of every changed entry; recording starts afresh."""
        void, other = self.take_changes_split()
        return [(k, VOID_NAMESPACE) for k in void] + list(other)

    def _compact(self) -> None:
        """Called when the records outgrow their limit: de-duplicate them only when at least
        half of them must be repeats (more records than twice the map's entries); else let the
        limit grow (amortized O(1) per record either way)."""
        n = len(self.void_keys) + len(self.pairs)
        if n <= 2 * len(self):
            self._limit = max(self._limit, 2 * len(self)) + 1
            return
        void = dict(zip(self.void_keys, self.void_states, strict=True))
        other = dict(zip(self.pairs, self.pair_states, strict=True))
        self.void_keys, self.void_states = list(void), list(void.values())
        self.pairs, self.pair_states = list(other), list(other.values())
        self._limit = max(_MIN_LIMIT, 4 * (len(void) + len(other)), 2 * len(self))

    def untracked_get(self, key: Any, namespace: Any) -> Any:
        """Read without recording (the checkpoint's own reads)."""
        raise NotImplementedError


def tracking_map_class(base: type[StateMap], track_reads: bool) -> type[TrackingStateMap]:
    """A subclass of ``base`` that records every write and clear (and every read when
    ``track_reads``: values the caller may mutate in place)."""
    cached = _CLASSES.get((base, track_reads))
    if cached is not None:
        return cached  # type: ignore[return-value]
    void = VOID_NAMESPACE
    missing, lookup = MISSING, LOOKUP
    b_get, b_put, b_put_old = base.get, base.put, base.put_and_get_old
    b_remove, b_remove_old, b_transform = base.remove, base.remove_and_get_old, base.transform

    def record(self: Any, key: Any, namespace: Any, state: Any) -> None:
        if namespace is void:
            keys = self.void_keys
            keys.append(key)
            self.void_states.append(state)
        else:
            keys = self.pairs
            keys.append((key, namespace))
            self.pair_states.append(state)
        if len(keys) > self._limit:
            self._compact()

    class Tracking(TrackingStateMap, base):  # type: ignore[valid-type,misc]
        __slots__ = ("_limit", "pair_states", "pairs", "special", "void_keys", "void_states")

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            base.__init__(self, *args, **kwargs)
            self.void_keys, self.void_states, self.pairs, self.pair_states = [], [], [], []
            self._limit = _MIN_LIMIT
            self.special = False

        untracked_get = b_get
        untracked_put = b_put
        untracked_remove = b_remove

        def put(self, key: Any, namespace: Any, state: Any) -> None:
            if namespace is void:
                keys = self.void_keys
                keys.append(key)
                self.void_states.append(state)
                if len(keys) > self._limit:
                    self._compact()
            else:
                record(self, key, namespace, state)
            b_put(self, key, namespace, state)

        def put_and_get_old(self, key: Any, namespace: Any, state: Any) -> Any:
            record(self, key, namespace, state)
            return b_put_old(self, key, namespace, state)

        def remove(self, key: Any, namespace: Any) -> None:
            record(self, key, namespace, missing)
            self.special = True
            b_remove(self, key, namespace)

        def remove_and_get_old(self, key: Any, namespace: Any) -> Any:
            record(self, key, namespace, missing)
            self.special = True
            return b_remove_old(self, key, namespace)

        def transform(
            self, key: Any, namespace: Any, value: Any, fn: Callable[[Any, Any], Any]
        ) -> None:
            if namespace is void:
                keys = self.void_keys
                keys.append(key)
                self.void_states.append(lookup)
                if len(keys) > self._limit:
                    self._compact()
            else:
                record(self, key, namespace, lookup)
            self.special = True
            b_transform(self, key, namespace, value, fn)

        if track_reads:

            def get(self, key: Any, namespace: Any) -> Any:
                state = b_get(self, key, namespace)
                if state is not None:  # the caller may mutate it in place
                    if namespace is void:
                        keys = self.void_keys
                        keys.append(key)
                        self.void_states.append(state)
                        if len(keys) > self._limit:
                            self._compact()
                    else:
                        record(self, key, namespace, state)
                return state

    Tracking.__name__ = Tracking.__qualname__ = (
        f"{'ReadTracking' if track_reads else 'Tracking'}{base.__name__}"
    )
    _CLASSES[(base, track_reads)] = Tracking
    return Tracking  # type: ignore[no-any-return]


def _has(values: list[Any], marker: Any) -> bool:
    return any(map(operator.is_, values, itertools.repeat(marker, len(values))))


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
        special = m.special
        void, other = m.take_changes_split()
        keys: list[Any] = list(void)
        states: list[Any] = list(void.values())
        namespaces: list[Any] = [VOID_NAMESPACE]
        if other:
            namespaces = [VOID_NAMESPACE] * len(keys)
            for k, ns in other:
                keys.append(k)
                namespaces.append(ns)
            states.extend(other.values())
        gone_keys: list[Any] = []
        gone_namespaces: list[Any] = []
        if transformer is not None or (special and (_has(states, MISSING) or _has(states, LOOKUP))):
            get, contains = m.untracked_get, m.contains
            kept_k: list[Any] = []
            kept_ns: list[Any] = []
            kept_s: list[Any] = []
            shared = len(namespaces) == 1
            for i, (k, v) in enumerate(zip(keys, states, strict=True)):
                ns = namespaces[0] if shared else namespaces[i]
                if v is LOOKUP:
                    v = get(k, ns)
                    if v is None and not contains(k, ns):
                        v = MISSING
                if v is not MISSING and transformer is not None:
                    v = transformer(v)
                    if v is None:
                        v = MISSING
                if v is MISSING:
                    gone_keys.append(k)
                    gone_namespaces.append(ns)
                else:
                    kept_k.append(k)
                    kept_ns.append(ns)
                    kept_s.append(v)
            keys, namespaces, states = kept_k, kept_ns, kept_s
        if copy is not None:
            states = [copy(v) for v in states]
        out.append(
            DeltaEntries(
                EntryColumns(keys, namespaces if keys else [], states),
                EntryColumns(gone_keys, gone_namespaces, None),
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
