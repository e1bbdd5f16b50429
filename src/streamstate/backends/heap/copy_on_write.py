"""The copy-on-write state map: Flink's ``CopyOnWriteStateMap`` in Python (SPEC §5.2).

A chained hash table ``(key, namespace) -> state`` for one key group, with two properties a plain
``dict`` lacks:

* **Incremental rehash.** When the size exceeds ``0.75 * capacity`` the map allocates a table of
  twice the capacity and moves whole buckets (at least 4 entries) into it at the start of every
  later operation, reads included. Bucket ``i`` of the old table splits into buckets ``i`` and
  ``i + old_len`` of the new one; an operation looks in the new table for buckets below
  ``rehash_index`` and in the old one otherwise. No single operation pays for the whole resize.
* **Copy-on-write snapshots.** :meth:`CopyOnWriteStateMap.snapshot` bumps the map version and
  keeps the bucket array as it is (see below for when it is copied). Every entry and state object
  reachable from that array is then shared with the snapshot, and the map copies before it
  changes any of them: an entry whose ``entry_version`` is older than the newest open snapshot
  is never relinked (the chain up to it is copied instead, entries after it stay shared), and a
  state object whose ``state_version`` is older is deep-copied before the caller can see it, on
  reads too (the caller may mutate what ``get`` returns). New entries are inserted at the head
  of their chain, so inserting never copies. A snapshot thread can therefore walk its array while
  the processing thread keeps writing; once the snapshot is released the old copies are garbage.

Python adaptation, and the stalls it designs around
----------------------------------------------------
* Entries are ``__slots__`` objects created without ``__init__`` on the hot path (a Python-level
  ``__init__`` frame costs more than the six slot stores). Methods bind attributes to locals;
  the lookup prologue is written out in each operation (a helper call costs more than a lookup).
  Lookups compare keys without comparing hashes first: two 64-bit ints compare no faster than
  typical keys. Entries do not cache their hash (Flink's do, for the rehash): in CPython the
  cached hash is a 32-byte int object per entry, and the rehash recomputes it cheaply;
  ``StateMapEntry.hash`` is a property computing the same value.
* A read-modify-write (a value state's ``value()`` then ``update()``) looks the entry up once:
  ``get`` remembers the entry it found together with the very key and namespace objects it was
  given, and a ``put`` with the same objects, while no rehash is in progress (a put owes its
  rehash step), writes to that entry if it is not shared with a snapshot. Everything that can
  unlink or supersede an entry (removal, chain copy, rehash step) forgets it first.
* The bucket array is copied on write, not in ``snapshot``. Flink's synchronous phase copies
  each array with ``System.arraycopy``, which never touches the entries. CPython cannot copy a
  reference without writing to the referenced object (its reference count), so ``primary[:]``
  touches every entry: 24 to 39 ms per million entries here (cache misses included), and
  67 ms per million at ten million: O(entries), not O(buckets). The snapshot therefore keeps
  the map's arrays themselves (O(1)) and marks them shared; the map copies them (``_unshare``)
  before its first bucket-slot write after the snapshot (an insert, a head removal, a chain
  copy, a rehash step).
  The content a snapshot reads is exactly the arrays §5.2 copies (the unmoved primary buckets
  plus, while rehashing, the two rehash-table ranges the moved buckets split into). The copy
  costs what the eager one would, but on the processing thread, one key group at a time (about
  5 ms for a key group of 78k entries), and not at all for a key group whose snapshot is
  released before the map writes to it.
* Hash: ``hash((key, namespace))``. CPython's tuple hash runs the element hashes through xxHash's
  multiply-rotate rounds, so int keys that are multiples of a power of two (whose own hash has
  zero low bits) still spread over the low bits used for bucket selection. It costs one tuple
  from the free list; measured cheaper than ``hash(key) ^ hash(namespace)`` plus any Python-level
  bit mixing (two ``hash`` calls and several big-int operations). The hash is process-local:
  it decides bucket order, never key groups.
* Allocation of a doubled table. ``[None] * n`` of a few million slots is itself O(n) (about
  70 ms for 2**24 slots here: page faults and stores). Two measures keep it out of the latency of
  single operations: the backend uses one map per key group (128 or more), so each table stays
  small; and for large tables (2**17 slots or more) the next table is pre-built in chunks of
  2**16 slots during the inserts that lead to the threshold, starting from the retired table of
  the previous rehash (which is all ``None`` once its buckets have moved) so that no multi-million
  slot list is freed or allocated in one go. ``double_capacity`` then only swaps the table in.
* CPython's cyclic garbage collector. Every entry is a tracked object, and so is every mutable
  state; a full (generation 2) collection walks all of them: about 160 ms here at one million
  entries with list states, seconds at ten million, and CPython starts one whenever the objects
  promoted since the last one exceed 25 % of the survivors of the last one, i.e. regularly while
  state grows. The map creates no reference cycles (chains are acyclic, versions are ints), so
  reference counting alone frees everything it drops, released snapshot copies included. The
  documented configuration is :func:`install_gc_policy`: before each full collection it calls
  :func:`gc.freeze` (O(1): it splices the GC's lists), so full collections never walk long-lived
  state; young collections still reclaim short-lived cycles. A young collection also walks every
  container allocated since the last one, and bucket arrays are large containers: when 128
  key-group maps double at about the same time (keys spread evenly), or copy their arrays after
  a snapshot, one young collection walked millions of slots and the entries behind them (26 ms
  here). The policy therefore also freezes before a young collection once more than
  ``FRESH_TABLE_SLOTS_BEFORE_FREEZE`` fresh bucket slots have accumulated. The trade-off:
  cyclic garbage that is alive at a freeze (anything older than two young collections, and
  whatever is young when large tables were just made) is only reclaimed by an explicit
  ``gc.unfreeze(); gc.collect()`` at a quiet moment (a restart or rescale). A lighter
  alternative is to call ``gc.freeze()`` after restoring state and once per micro-batch.
  ``bench/state_map.py`` measures the stalls with and without the policy.
* Writing a snapshot from another thread under the GIL. The writer only reads entries that are
  never relinked while the snapshot is open, so it needs no lock; but a writer that encodes large
  batches in one C call (msgspec) holds the GIL for the whole call, and two CPU-bound threads
  otherwise split the interpreter 50/50 in 5 ms slices. Writers should encode in chunks
  (:meth:`CopyOnWriteStateMapSnapshot.chunks`) and yield with a short ``time.sleep`` between
  chunks, which hands the GIL to the processing thread for a whole switch interval.
"""

from __future__ import annotations

import copy as _copy_module
import gc
import itertools
import sys
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from streamstate._compiled import compiled
from streamstate.backends.heap.state_map import (
    StateMap,
    StateMapSnapshot,
    StateSnapshotTransformer,
)
from streamstate.serializers.base import TypeSerializer

__all__ = [
    "DEFAULT_CAPACITY",
    "MAXIMUM_CAPACITY",
    "MINIMUM_CAPACITY",
    "MIN_TRANSFERRED_PER_INCREMENTAL_REHASH",
    "NOT_REHASHING",
    "NO_HIT",
    "CopyOnWriteStateMap",
    "CopyOnWriteStateMapSnapshot",
    "PyStateMapEntry",
    "StateMapEntry",
    "install_gc_policy",
    "uninstall_gc_policy",
]

MINIMUM_CAPACITY = 4
MAXIMUM_CAPACITY = 1 << 30
DEFAULT_CAPACITY = 128
MIN_TRANSFERRED_PER_INCREMENTAL_REHASH = 4

#: Java's largest array; the threshold once the table cannot grow any more.
_MAX_ARRAY_SIZE = (1 << 31) - 1 - 8

#: Identity marks "not rehashing"; a tuple so that nothing can ever be written into it.
_EMPTY_TABLE: tuple[None, ...] = (None,) * (MINIMUM_CAPACITY >> 1)
#: the rehash table of a map that is not rehashing (the compiled value state compares with it)
NOT_REHASHING = _EMPTY_TABLE

#: Tables at least this long are pre-built in chunks instead of allocated in one call.
_INCREMENTAL_ALLOC_MIN = 1 << 17
_ALLOC_CHUNK = 1 << 16
# below this many entries a bulk load is plain puts (sizing the table does not pay)
_BULK_LOAD_MIN = 64
_NONE_CHUNK: list[None] = [None] * _ALLOC_CHUNK
_NEVER = sys.maxsize

_new = object.__new__
#: no key is this object: the last-hit cache of an empty map, or after an invalidation
_NO_HIT: Any = object()
#: the last-hit key of a map that has no last hit (the compiled value state's rehash step sets it)
NO_HIT = _NO_HIT


class PyStateMapEntry:
    """One mapping: key, namespace, state, chain link and two versions (the pure-Python
    reference of :data:`StateMapEntry`).

    ``entry_version`` protects the entry's structure (its ``next`` link), ``state_version`` the
    state object. Both are map versions; an entry or state older than the newest open snapshot is
    shared with it and must be copied before it is changed.

    Unlike Flink's entry it does not cache the hash: a stored hash is a separate 32-byte int
    object (hashes are 64-bit, beyond CPython's small-int cache) plus a slot, 40 of the 140
    bytes an entry cost, and only the rehash reads it, which recomputes ``hash((key,
    namespace))`` instead (C-speed: a ``str`` caches its own hash).
    """

    __slots__ = ("entry_version", "key", "namespace", "next", "state", "state_version")

    def __init__(
        self,
        key: Any,
        namespace: Any,
        state: Any,
        next_: PyStateMapEntry | None,
        entry_version: int,
        state_version: int,
    ) -> None:
        self.key = key
        self.namespace = namespace
        self.state = state
        self.next = next_
        self.entry_version = entry_version
        self.state_version = state_version

    @property
    def hash(self) -> int:
        """The hash that places the entry in its bucket (``hash((key, namespace))``)."""
        return hash((self.key, self.namespace))

    def __repr__(self) -> str:
        return (
            f"StateMapEntry({self.key!r}, {self.namespace!r}, {self.state!r}, "
            f"entry_version={self.entry_version}, state_version={self.state_version})"
        )


def _entry_type() -> type[PyStateMapEntry]:
    """The compiled entry (``_entry.c``: 64 bytes, untracked by the cyclic GC) when it was
    built and ``STREAMSTATE_PURE_PYTHON`` is not set; else the pure-Python reference."""
    module = compiled("streamstate.backends.heap._entry")
    return PyStateMapEntry if module is None else module.StateMapEntry  # type: ignore[no-any-return]


if TYPE_CHECKING:
    StateMapEntry = PyStateMapEntry
else:
    #: The entry type the maps create: same attributes, constructor, ``hash`` and repr either way
    StateMapEntry = _entry_type()

Table = list[StateMapEntry | None]


def _none_error(key: Any, namespace: Any) -> ValueError:
    what = "key" if key is None else "namespace"
    return ValueError(f"a state map {what} must not be None (key={key!r}, namespace={namespace!r})")


class CopyOnWriteStateMap(StateMap):
    """``(key, namespace) -> state`` with incremental rehash and copy-on-write snapshots.

    ``serializer`` copies shared state objects before they are handed out or changed: ``None``
    means :func:`copy.deepcopy`; a serializer whose ``immutable`` is true means states are never
    copied (they cannot be mutated in place). ``capacity`` is rounded up to a power of two within
    ``[MINIMUM_CAPACITY, MAXIMUM_CAPACITY]``.

    >>> m = CopyOnWriteStateMap()
    >>> m.put("alice", "ns", [1])
    >>> snap = m.snapshot()
    >>> m.get("alice", "ns").append(2)      # copy on read: the snapshot keeps [1]
    >>> m.get("alice", "ns"), list(snap)
    ([1, 2], [('alice', 'ns', [1])])
    >>> snap.release()

    All operations are O(1) expected time; an operation during a rehash also moves at least four
    entries, and the first bucket write after a snapshot copies the bucket arrays (O(capacity)).
    :meth:`snapshot` is O(1). Not thread-safe, except that a snapshot may be iterated and released
    from another thread while the owner thread keeps operating.
    """

    __slots__ = (
        "_copy",
        "_hit",
        "_hit_key",
        "_hit_namespace",
        "_last_namespace",
        "_lock",
        "_mask",
        "_mod_count",
        "_primary",
        "_primary_size",
        "_rehash_index",
        "_rehash_size",
        "_rehash_table",
        "_required",
        "_shared",
        "_snapshot_versions",
        "_spare",
        "_spare_mark",
        "_state_map_version",
        "_threshold",
    )

    def __init__(
        self, serializer: TypeSerializer[Any] | None = None, capacity: int = DEFAULT_CAPACITY
    ) -> None:
        if capacity < 0:
            raise ValueError(f"state map capacity must not be negative: {capacity}")
        if capacity < MINIMUM_CAPACITY:
            capacity = MINIMUM_CAPACITY
        elif capacity > MAXIMUM_CAPACITY:
            capacity = MAXIMUM_CAPACITY
        else:
            capacity = 1 << (capacity - 1).bit_length()
        if serializer is None:
            self._copy: Callable[[Any], Any] | None = _copy_module.deepcopy
        elif serializer.immutable:
            self._copy = None
        else:
            self._copy = serializer.copy
        self._threshold = 0
        # the table the next doubling will use, pre-built in chunks (large tables only)
        self._spare: Table | None = None
        self._spare_mark = _NEVER
        self._primary: Table = self._make_table(capacity)
        self._mask = capacity - 1  # of the primary table
        self._rehash_table: Table | tuple[None, ...] = _EMPTY_TABLE
        self._primary_size = 0
        self._rehash_size = 0
        self._rehash_index = 0
        self._state_map_version = 0
        self._required = 0
        self._snapshot_versions: list[int] = []
        self._mod_count = 0
        # the tables are referenced by an open snapshot: copy them before writing a bucket slot
        self._shared = False
        self._last_namespace: Any = None
        # the entry the last get found, with the very key and namespace objects it was asked
        # for: a put with the same objects (a value state's read-modify-write) writes to it
        # without a second lookup. Whatever can unlink or supersede an entry clears it.
        self._hit: StateMapEntry | None = None
        self._hit_key: Any = _NO_HIT
        self._hit_namespace: Any = _NO_HIT
        self._lock = threading.Lock()

    # -- introspection ---------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Number of buckets of the primary table (the rehash table, if any, has twice as many).

        >>> m = CopyOnWriteStateMap()
        >>> for k in range(98): m.put(k, 0, k)      # the 98th insert: size 97 > 96
        >>> m.capacity, m.is_rehashing, m.rehash_index
        (128, True, 0)
        >>> _ = m.get(0, 0); m.rehash_index > 0     # every operation moves a few buckets
        True
        """
        return len(self._primary)

    @property
    def is_rehashing(self) -> bool:
        """Whether an incremental rehash is in progress."""
        return self._rehash_table is not _EMPTY_TABLE

    @property
    def rehash_index(self) -> int:
        """The next primary bucket an incremental rehash step moves (0 when not rehashing)."""
        return self._rehash_index

    @property
    def state_map_version(self) -> int:
        """The map's version; each snapshot increments it."""
        return self._state_map_version

    @property
    def highest_required_snapshot_version(self) -> int:
        """Version of the newest open snapshot, or 0 when none is open."""
        return self._required

    @property
    def snapshot_versions(self) -> tuple[int, ...]:
        """Versions of the open snapshots, ascending; O(open snapshots).

        >>> m = CopyOnWriteStateMap(); a, b = m.snapshot(), m.snapshot(); a.release()
        >>> m.snapshot_versions, m.highest_required_snapshot_version, m.state_map_version
        ((2,), 2, 2)
        """
        with self._lock:
            return tuple(self._snapshot_versions)

    def __len__(self) -> int:
        """Number of entries, O(1).

        >>> m = CopyOnWriteStateMap(); m.put(1, 0, "a"); m.put(2, 0, "b"); len(m)
        2
        """
        return self._primary_size + self._rehash_size

    def __repr__(self) -> str:
        return (
            f"CopyOnWriteStateMap(size={len(self)}, capacity={self.capacity}, "
            f"rehashing={self.is_rehashing}, version={self._state_map_version}, "
            f"required={self._required})"
        )

    # -- reads -----------------------------------------------------------------------------------
    #
    # The hot paths share one prologue, written out in each method because a helper call costs
    # more than the lookup itself in CPython: hash, then the active table and bucket. Lookups
    # compare keys without first comparing hashes (two 64-bit ints compare no faster
    # than typical keys), and try namespace identity first (inserts share equal namespaces).
    # None keys and namespaces are rejected on the miss and insert paths only: no entry can hold
    # one, so a hit proves the arguments valid and costs nothing.

    def get(self, key: Any, namespace: Any) -> Any:
        """The state of ``(key, namespace)``, or None; O(1) expected.

        A state shared with an open snapshot is copied first (the caller may mutate the result).

        >>> m = CopyOnWriteStateMap(); m.put("k", "ns", 7)
        >>> m.get("k", "ns"), m.get("k", "other")
        (7, None)
        """
        h = hash((key, namespace))
        if self._rehash_table is _EMPTY_TABLE:
            tab = self._primary
            index = h & self._mask
        else:
            tab = self._select_active_table(h)
            index = h & (len(tab) - 1)
        e = tab[index]
        while e is not None:
            if (e.key is key or e.key == key) and (
                e.namespace is namespace or e.namespace == namespace
            ):
                if e.state_version < self._required:
                    return self._get_shared(tab, index, e)
                self._hit = e
                self._hit_key = key
                self._hit_namespace = namespace
                return e.state
            e = e.next
        if key is None or namespace is None:
            raise _none_error(key, namespace)
        return None

    def contains(self, key: Any, namespace: Any) -> bool:
        """Whether ``(key, namespace)`` has an entry; O(1) expected, never copies.

        >>> m = CopyOnWriteStateMap(); m.put("k", "ns", None)
        >>> m.contains("k", "ns"), m.contains("k", "x")
        (True, False)
        """
        h = hash((key, namespace))
        if self._rehash_table is _EMPTY_TABLE:
            e = self._primary[h & self._mask]
        else:
            tab = self._select_active_table(h)
            e = tab[h & (len(tab) - 1)]
        while e is not None:
            if (e.key is key or e.key == key) and (
                e.namespace is namespace or e.namespace == namespace
            ):
                return True
            e = e.next
        if key is None or namespace is None:
            raise _none_error(key, namespace)
        return False

    # -- writes ----------------------------------------------------------------------------------

    def put(self, key: Any, namespace: Any, state: Any) -> None:
        """Map ``(key, namespace)`` to ``state``; O(1) expected.

        >>> m = CopyOnWriteStateMap(); m.put("k", "ns", 1); m.put("k", "ns", 2); m.get("k", "ns")
        2
        """
        if (
            key is self._hit_key
            and namespace is self._hit_namespace
            and self._rehash_table is _EMPTY_TABLE  # else this put owes a rehash step
        ):
            hit = self._hit
            if hit.entry_version >= self._required:  # type: ignore[union-attr]
                hit.state = state  # type: ignore[union-attr]
                hit.state_version = self._state_map_version  # type: ignore[union-attr]
                return
        h = hash((key, namespace))
        if self._rehash_table is _EMPTY_TABLE:
            tab = self._primary
            index = h & self._mask
        else:
            tab = self._select_active_table(h)
            index = h & (len(tab) - 1)
        e = tab[index]
        while e is not None:
            if (e.key is key or e.key == key) and (
                e.namespace is namespace or e.namespace == namespace
            ):
                if e.entry_version < self._required:
                    e = self._copy_chain_until(tab, index, e)
                e.state = state
                e.state_version = self._state_map_version
                return
            e = e.next
        self._add_entry(tab, index, key, namespace, state)

    def put_and_get_old(self, key: Any, namespace: Any, state: Any) -> Any:
        """Map ``(key, namespace)`` to ``state``; return the previous state or None. O(1) expected.

        >>> m = CopyOnWriteStateMap(); m.put_and_get_old("k", "ns", 1)
        >>> m.put_and_get_old("k", "ns", 2)
        1
        """
        e = self._put_entry(key, namespace)
        old = e.state
        if e.state_version < self._required and self._copy is not None:
            old = self._copy(old)
        e.state = state
        e.state_version = self._state_map_version
        return old

    def transform(
        self, key: Any, namespace: Any, value: Any, fn: Callable[[Any, Any], Any]
    ) -> None:
        """Set the state to ``fn(old_state_or_None, value)``; O(1) expected plus ``fn``.

        ``fn`` receives a private copy when the old state is shared with a snapshot. If ``fn``
        raises, the map is left as it was.

        >>> m = CopyOnWriteStateMap()
        >>> m.transform("k", "ns", 5, lambda s, v: (s or 0) + v)
        >>> m.transform("k", "ns", 5, lambda s, v: (s or 0) + v); m.get("k", "ns")
        10
        """
        mod_count = self._mod_count
        e = self._put_entry(key, namespace)
        old = e.state
        if e.state_version < self._required and self._copy is not None:
            old = self._copy(old)
        try:
            new = fn(old, value)
        except BaseException:
            if self._mod_count != mod_count:  # the entry was created for this call
                self.remove(key, namespace)
            raise
        e.state = new
        e.state_version = self._state_map_version

    def remove(self, key: Any, namespace: Any) -> None:
        """Remove the entry of ``(key, namespace)`` if any; O(1) expected.

        >>> m = CopyOnWriteStateMap(); m.put("k", "ns", 1); m.remove("k", "ns"); len(m)
        0
        """
        self._remove_entry(key, namespace)

    def remove_and_get_old(self, key: Any, namespace: Any) -> Any:
        """Remove the entry of ``(key, namespace)``; return its state or None. O(1) expected.

        >>> m = CopyOnWriteStateMap(); m.put("k", "ns", 1)
        >>> m.remove_and_get_old("k", "ns"), m.remove_and_get_old("k", "ns")
        (1, None)
        """
        e = self._remove_entry(key, namespace)
        if e is None:
            return None
        if e.state_version < self._required and self._copy is not None:
            return self._copy(e.state)
        return e.state

    # -- iteration -------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[Any, Any, Any]]:
        """Yield ``(key, namespace, state)`` for every entry; O(capacity + n) in total.

        A live view: the states are the map's own objects (do not mutate them), and a
        structural change during the iteration (an insert, a removal, a rehash step, which reads
        perform too, or a copy of the bucket array) makes the next step raise ``RuntimeError``.

        >>> m = CopyOnWriteStateMap(); m.put("k", "ns", 1); list(m)
        [('k', 'ns', 1)]
        """
        primary = self._primary
        tables = [primary]
        if self._rehash_table is not _EMPTY_TABLE:
            tables.append(self._rehash_table)  # type: ignore[arg-type]
        mod_count = self._mod_count
        rehash_index = self._rehash_index
        for tab in tables:
            for e in tab:
                while e is not None:
                    yield e.key, e.namespace, e.state
                    if (
                        self._mod_count != mod_count
                        or self._rehash_index != rehash_index
                        or self._primary is not primary
                    ):
                        raise RuntimeError("state map changed during iteration")
                    e = e.next

    def replace_states(self, convert: Callable[[list[Any]], list[Any]]) -> Callable[[], None]:
        """In place: every entry's state is set to its image (O(capacity + n), no entry made
        anew). While a snapshot shares entries, the entries are copied on write instead (one
        ``put`` each).

        >>> m = CopyOnWriteStateMap(); m.put("k", "ns", 1)
        >>> m.replace_states(lambda states: [s * 2.5 for s in states])(); m.get("k", "ns")
        2.5
        """
        if self._snapshot_versions or self._shared:
            return super().replace_states(convert)
        entries = []
        tables = [self._primary]
        if self._rehash_table is not _EMPTY_TABLE:
            tables.append(self._rehash_table)  # type: ignore[arg-type]
        for tab in tables:
            for e in tab:
                while e is not None:
                    entries.append(e)
                    e = e.next
        states = convert([e.state for e in entries])

        def commit() -> None:
            for e, state in zip(entries, states, strict=True):
                e.state = state

        return commit

    def keys(self, namespace: Any) -> Iterator[Any]:
        """Keys that have an entry under ``namespace``; O(capacity + n), collected up front.

        >>> m = CopyOnWriteStateMap(); m.put("a", 1, 0); m.put("b", 2, 0); list(m.keys(1))
        ['a']
        """
        return iter([k for k, ns, _ in self if ns == namespace])

    # -- snapshots -------------------------------------------------------------------------------

    def snapshot(self) -> CopyOnWriteStateMapSnapshot:
        """A consistent view of the current content; O(1), the bucket array is copied on write.

        Call it on the thread that modifies the map. The snapshot must be released (from any
        thread) once written; until then the map copies what it shares with it before changing
        it: entries and states as in Flink, and the bucket arrays themselves (see the module
        docstring), so taking a snapshot never touches the entries.

        >>> m = CopyOnWriteStateMap(); m.put("k", "ns", 1)
        >>> s = m.snapshot(); m.put("k", "ns", 2); list(s), m.get("k", "ns")
        ([('k', 'ns', 1)], 2)
        >>> s.release()
        """
        with self._lock:
            self._state_map_version += 1
            version = self._state_map_version
            self._required = version
            self._snapshot_versions.append(version)  # the newest version: the list stays sorted
            self._shared = True
        rehash_table = self._rehash_table
        return CopyOnWriteStateMapSnapshot(
            self,
            self._primary,
            None if rehash_table is _EMPTY_TABLE else rehash_table,  # type: ignore[arg-type]
            self._rehash_index,
            version,
            len(self),
        )

    def release_snapshot(self, version: int) -> None:
        """Stop protecting the snapshot of ``version``; O(open snapshots). Any thread.

        Raises ``ValueError`` for a version that is not open (unknown or already released).

        >>> m = CopyOnWriteStateMap(); s = m.snapshot(); m.release_snapshot(s.version)
        >>> m.highest_required_snapshot_version
        0
        """
        with self._lock:
            versions = self._snapshot_versions
            i = bisect_left(versions, version)
            if i == len(versions) or versions[i] != version:
                raise ValueError(
                    f"attempt to release unknown snapshot version {version} (open: {versions})"
                )
            del versions[i]
            if versions:
                self._required = versions[-1]
            else:
                self._required = 0
                self._shared = False

    # -- internals -------------------------------------------------------------------------------

    def _select_active_table(self, h: int) -> Table:
        """Perform one incremental rehash step, then pick the table responsible for ``h``."""
        self._incremental_rehash()
        tab = self._primary
        if (h & (len(tab) - 1)) < self._rehash_index:
            return self._rehash_table  # type: ignore[return-value]
        return tab

    def _get_shared(self, tab: Table, index: int, e: StateMapEntry) -> Any:
        """``get``'s copy-on-read of a state object shared with an open snapshot."""
        cp = self._copy
        if cp is None:  # immutable states cannot be changed through what get returns
            return e.state
        if e.entry_version < self._required:
            e = self._copy_chain_until(tab, index, e)
        e.state_version = self._state_map_version
        e.state = state = cp(e.state)
        return state

    def put_all(self, keys: list[Any], namespaces: list[Any], states: list[Any]) -> None:
        """Bulk load (restore): ``put`` every ``(keys[i], namespaces[i], states[i])``.

        Into an empty map with no open snapshot, the table is sized once for the final size and
        entries are linked in directly: no incremental rehash, no per-entry method call. Equal
        ``(key, namespace)`` pairs keep the last state, as repeated ``put`` would. Otherwise (or
        for few entries) this is one ``put`` per entry. O(n) either way.

        >>> m = CopyOnWriteStateMap()
        >>> m.put_all(list(range(5000)), ["ns"], [k * 2 for k in range(5000)])
        >>> len(m), m.get(4999, "ns"), m.capacity, m.is_rehashing
        (5000, 9998, 8192, False)
        """
        n = len(keys)
        if (
            n < _BULK_LOAD_MIN
            or self._primary_size
            or self._rehash_size
            or self._snapshot_versions
            or self._shared
            or self._rehash_table is not _EMPTY_TABLE
        ):
            super().put_all(keys, namespaces, states)
            return
        if len(namespaces) == 1 and n != 1:
            ns = namespaces[0]
            if ns is None:
                raise _none_error(keys[0] if keys else None, ns)
            pairs: Any = ((k, ns) for k in keys)
        else:
            if len(namespaces) != n or len(states) != n:
                raise ValueError("put_all needs as many namespaces and states as keys")
            pairs = zip(keys, namespaces, strict=True)
        # de-duplicate (last wins) while computing each pair's hash once, via the dict
        merged = dict(zip(pairs, states, strict=True))
        size = len(merged)
        capacity = len(self._primary)
        while capacity < MAXIMUM_CAPACITY and size > (capacity >> 1) + (capacity >> 2):
            capacity <<= 1
        self._spare = None
        self._spare_mark = _NEVER
        tab = self._make_table(capacity) if capacity != len(self._primary) else self._primary
        mask = capacity - 1
        version = self._state_map_version
        new = _new
        cls = StateMapEntry
        for pair, state in merged.items():
            key, namespace = pair
            if key is None or namespace is None:
                raise _none_error(key, namespace)
            h = hash(pair)
            index = h & mask
            e = new(cls)
            e.key = key
            e.namespace = namespace
            e.state = state
            e.next = tab[index]
            e.entry_version = version
            e.state_version = version
            tab[index] = e
        self._primary = tab
        self._mask = mask
        self._primary_size = size
        self._mod_count += size

    def _put_entry(self, key: Any, namespace: Any) -> StateMapEntry:
        """The entry of ``(key, namespace)``, private to the map's current version."""
        h = hash((key, namespace))
        if self._rehash_table is _EMPTY_TABLE:
            tab = self._primary
            index = h & self._mask
        else:
            tab = self._select_active_table(h)
            index = h & (len(tab) - 1)
        e = tab[index]
        while e is not None:
            if (e.key is key or e.key == key) and (
                e.namespace is namespace or e.namespace == namespace
            ):
                if e.entry_version < self._required:
                    e = self._copy_chain_until(tab, index, e)
                return e
            e = e.next
        return self._add_entry(tab, index, key, namespace, None)

    def _add_entry(
        self, tab: Table, index: int, key: Any, namespace: Any, state: Any
    ) -> StateMapEntry:
        """Insert a new entry at the head of ``tab[index]`` (head insertion never copies).

        The compiled value state (``_value_state.c``, ``insert_entry``) makes the same insert
        when neither branch below is taken: a change here is a change there too.
        """
        if key is None or namespace is None:
            raise _none_error(key, namespace)
        if self._shared:
            tab = self._unshare(tab)
        self._mod_count += 1
        size = self._primary_size + self._rehash_size
        if size > self._threshold:
            # only allocates the rehash table; `tab` stays right since rehash_index is 0
            self._double_capacity()
        elif size >= self._spare_mark:
            self._grow_spare(size)
        last = self._last_namespace
        if namespace is not last:
            # keep one namespace object per run of equal ones (windows are made per record)
            if namespace == last:
                namespace = last
            else:
                self._last_namespace = namespace
        version = self._state_map_version
        e = _new(StateMapEntry)  # no __init__ frame: cheaper than StateMapEntry(...)
        e.key = key
        e.namespace = namespace
        e.state = state
        e.next = tab[index]
        e.entry_version = version
        e.state_version = version
        tab[index] = e
        if tab is self._primary:
            self._primary_size += 1
        else:
            self._rehash_size += 1
        return e

    def _remove_entry(self, key: Any, namespace: Any) -> StateMapEntry | None:
        self._hit_key = _NO_HIT
        self._hit = None
        h = hash((key, namespace))
        if self._rehash_table is _EMPTY_TABLE:
            tab = self._primary
            index = h & self._mask
        else:
            tab = self._select_active_table(h)
            index = h & (len(tab) - 1)
        e = tab[index]
        prev = None
        while e is not None:
            if (e.key is key or e.key == key) and (
                e.namespace is namespace or e.namespace == namespace
            ):
                in_primary = tab is self._primary  # before an unshare replaces the tables
                if prev is None:
                    if self._shared:
                        tab = self._unshare(tab)
                    tab[index] = e.next  # no entry is copied: the bucket slot is the map's own
                else:
                    if prev.entry_version < self._required:
                        prev = self._copy_chain_until(tab, index, prev)
                    prev.next = e.next
                self._mod_count += 1
                if in_primary:
                    self._primary_size -= 1
                else:
                    self._rehash_size -= 1
                return e
            prev = e
            e = e.next
        if key is None or namespace is None:
            raise _none_error(key, namespace)
        return None

    def _copy_chain_until(self, tab: Table, index: int, until: StateMapEntry) -> StateMapEntry:
        """Copy every link shared with a snapshot from the head of ``tab[index]`` to ``until``.

        Returns ``until``'s private counterpart; the entries after it stay shared.
        """
        self._hit_key = _NO_HIT
        self._hit = None
        if self._shared:
            tab = self._unshare(tab)
        required = self._required
        version = self._state_map_version
        cur = tab[index]
        assert cur is not None
        if cur.entry_version < required:
            copy = _copy_entry(cur, version)
            tab[index] = copy
        else:
            copy = cur
        while cur is not until:
            cur = cur.next
            assert cur is not None, "copy_chain_until: entry not in its chain"
            if cur.entry_version < required:
                nxt = _copy_entry(cur, version)
                copy.next = nxt
                copy = nxt
            else:
                copy = cur
        return copy

    def _unshare(self, tab: Table) -> Table:
        """Give the map private copies of the tables an open snapshot holds; return ``tab``'s.

        O(capacity): CPython cannot copy a reference without writing to its object (the
        reference count), so this touches every entry; it runs at the first bucket write after
        a snapshot instead of inside the snapshot, and not at all if the snapshot is released
        first (the writer releases each key group as soon as it is written).
        """
        primary = self._primary
        rehash_table = self._rehash_table
        global _fresh_table_slots
        self._primary = new_primary = list(primary)
        self._shared = False
        _fresh_table_slots += len(new_primary)
        if rehash_table is not _EMPTY_TABLE:
            self._rehash_table = new_rehash = list(rehash_table)
            _fresh_table_slots += len(new_rehash)
            if tab is rehash_table:
                return new_rehash
        return new_primary

    def _make_table(self, capacity: int) -> Table:
        """A table of ``capacity`` empty buckets; sets the threshold for that capacity."""
        if capacity < MAXIMUM_CAPACITY:
            self._threshold = (capacity >> 1) + (capacity >> 2)
        else:
            self._threshold = _MAX_ARRAY_SIZE
        spare = self._spare
        if spare is not None:
            self._spare = None
            self._spare_mark = _NEVER
            missing = capacity - len(spare)
            if missing > 0:  # the pre-building fell behind: finish it now
                spare.extend([None] * missing)
            if missing >= 0:
                return spare
        global _fresh_table_slots
        _fresh_table_slots += capacity
        return [None] * capacity

    def _double_capacity(self) -> None:
        if self._rehash_table is not _EMPTY_TABLE:
            raise RuntimeError("there is already a rehash in progress")
        capacity = len(self._primary)
        if capacity >= MAXIMUM_CAPACITY:
            return
        self._rehash_table = self._make_table(capacity * 2)

    def _grow_spare(self, size: int) -> None:
        """Append one chunk of empty buckets to the table the next doubling will use."""
        spare = self._spare
        if spare is None or self._rehash_table is not _EMPTY_TABLE:
            self._spare_mark = _NEVER
            return
        missing = 2 * len(self._primary) - len(spare)
        if missing > 0:
            chunk = min(missing, _ALLOC_CHUNK)
            spare += _NONE_CHUNK if chunk == _ALLOC_CHUNK else [None] * chunk
            missing -= chunk
        if missing <= 0:
            self._spare_mark = _NEVER
            return
        chunks_left = (missing + _ALLOC_CHUNK - 1) // _ALLOC_CHUNK
        inserts_left = max(1, self._threshold - size)
        self._spare_mark = size + max(1, inserts_left // (chunks_left + 1))

    def _incremental_rehash(self) -> None:
        """Move at least ``MIN_TRANSFERRED_PER_INCREMENTAL_REHASH`` entries, whole buckets only.

        The compiled value state (``_value_state.c``, ``rehash_step``) takes the same step when
        the map is not shared with a snapshot and the step does not finish: a change here is a
        change there too.
        """
        self._hit_key = _NO_HIT
        self._hit = None
        if self._shared:
            self._unshare(self._primary)
        old = self._primary
        new = self._rehash_table
        old_capacity = len(old)
        mask = len(new) - 1
        required = self._required
        version = self._state_map_version
        r = self._rehash_index
        moved = 0
        while moved < MIN_TRANSFERRED_PER_INCREMENTAL_REHASH:
            e = old[r]
            while e is not None:
                if e.entry_version < required:
                    e = _copy_entry(e, version)  # never relink an entry a snapshot can see
                n = e.next
                pos = hash((e.key, e.namespace)) & mask
                e.next = new[pos]
                new[pos] = e  # type: ignore[index]
                e = n
                moved += 1
            old[r] = None
            r += 1
            if r == old_capacity:
                self._primary = new  # type: ignore[assignment]
                self._mask = mask
                self._rehash_table = _EMPTY_TABLE
                self._primary_size += self._rehash_size
                self._rehash_size = 0
                self._rehash_index = 0
                if 2 * len(new) >= _INCREMENTAL_ALLOC_MIN:
                    # all buckets are None now: grow it into the next table instead of freeing it
                    threshold = self._threshold
                    self._spare = old
                    self._spare_mark = max(
                        self._primary_size + 1, (threshold >> 1) + (threshold >> 2)
                    )
                return
        self._primary_size -= moved
        self._rehash_size += moved
        self._rehash_index = r


def _copy_entry(e: StateMapEntry, entry_version: int) -> StateMapEntry:
    c = _new(StateMapEntry)
    c.key = e.key
    c.namespace = e.namespace
    c.state = e.state
    c.next = e.next
    c.entry_version = entry_version
    c.state_version = e.state_version
    return c


class CopyOnWriteStateMapSnapshot(StateMapSnapshot):
    """The content of a :class:`CopyOnWriteStateMap` when :meth:`~CopyOnWriteStateMap.snapshot`
    was called, readable from any thread while the map keeps changing.

    It holds the map's bucket arrays as they were (the map copies them before its next bucket
    write) and reads, as in §5.2, the unmoved primary buckets ``[rehash_index:]`` and, while
    rehashing, the two ranges ``[:rehash_index]`` and ``[len/2 : len/2 + rehash_index]`` of the
    rehash table that the moved buckets split into.

    >>> m = CopyOnWriteStateMap(); m.put("k", "ns", [1]); s = m.snapshot()
    >>> m.remove("k", "ns"); len(s), list(s)
    (1, [('k', 'ns', [1])])
    >>> s.release(); s.release()            # idempotent
    """

    __slots__ = ("_owner", "_primary", "_rehash_index", "_rehash_table", "_size", "_version")

    def __init__(
        self,
        owner: CopyOnWriteStateMap,
        primary: Table,
        rehash_table: Table | None,
        rehash_index: int,
        version: int,
        size: int,
    ) -> None:
        self._owner = owner
        self._primary: Table | None = primary
        self._rehash_table = rehash_table
        self._rehash_index = rehash_index
        self._version = version
        self._size = size

    @property
    def version(self) -> int:
        """The map version this snapshot protects."""
        return self._version

    @property
    def is_released(self) -> bool:
        return self._primary is None

    def __len__(self) -> int:
        """Number of entries at snapshot time, O(1)."""
        return self._size

    def bucket_heads(self) -> Table:
        """The snapshot's bucket array as §5.2 assembles it (the three slices while rehashing).

        O(buckets); iteration walks the same ranges without building this list.

        >>> m = CopyOnWriteStateMap(capacity=4); m.put(1, 0, 1); s = m.snapshot()
        >>> len(s.bucket_heads()), sum(e is not None for e in s.bucket_heads())
        (4, 1)
        >>> s.release()
        """
        primary = self._checked_primary()
        ri = self._rehash_index
        heads = primary[ri:]
        rehash_table = self._rehash_table
        if rehash_table is not None:
            half = len(rehash_table) >> 1
            heads += rehash_table[:ri]
            heads += rehash_table[half : half + ri]
        return heads

    def __iter__(self) -> Iterator[tuple[Any, Any, Any]]:
        """Yield ``(key, namespace, state)`` as of snapshot time; O(buckets + entries) in total."""
        primary = self._checked_primary()
        ri = self._rehash_index
        rehash_table = self._rehash_table
        if rehash_table is None:
            return _walk(primary, ri, len(primary))
        half = len(rehash_table) >> 1
        return itertools.chain(
            _walk(primary, ri, len(primary)),
            _walk(rehash_table, 0, ri),
            _walk(rehash_table, half, half + ri),
        )

    def chunks(
        self, max_entries: int = 2048, transformer: StateSnapshotTransformer | None = None
    ) -> Iterator[list[tuple[Any, Any, Any]]]:
        """Lists of at most ``max_entries`` ``(key, namespace, state)`` (transformed if given).

        The unit a writer encodes in one C call before yielding the GIL.

        >>> m = CopyOnWriteStateMap()
        >>> for i in range(5): m.put(i, 0, i)
        >>> s = m.snapshot(); [len(c) for c in s.chunks(2)]
        [2, 2, 1]
        >>> s.release()
        """
        if max_entries < 1:
            raise ValueError(f"max_entries must be positive: {max_entries}")
        chunk: list[tuple[Any, Any, Any]] = []
        append = chunk.append
        for item in self.iter_transformed(transformer):
            append(item)
            if len(chunk) >= max_entries:
                yield chunk
                chunk = []
                append = chunk.append
        if chunk:
            yield chunk

    def release(self) -> None:
        """Tell the map this snapshot is written; idempotent, any thread, O(open snapshots)."""
        if self._primary is not None:
            self._primary = None
            self._rehash_table = None
            self._owner.release_snapshot(self._version)

    def _checked_primary(self) -> Table:
        primary = self._primary
        if primary is None:
            raise RuntimeError(f"state map snapshot version {self._version} was already released")
        return primary

    def __repr__(self) -> str:
        state = "released" if self._primary is None else "open"
        return f"CopyOnWriteStateMapSnapshot(version={self._version}, size={self._size}, {state})"


def _walk(table: Table, start: int, stop: int) -> Iterator[tuple[Any, Any, Any]]:
    for e in itertools.islice(table, start, stop):
        while e is not None:
            yield e.key, e.namespace, e.state
            e = e.next


# -- GC configuration ------------------------------------------------------------------------------

#: Bucket-array slots allocated since the last freeze: a young collection would walk them all,
#: and the entries they point to (a cache miss each), until they are promoted.
_fresh_table_slots = 0
#: The young collection that would walk more fresh slots than this freezes instead.
FRESH_TABLE_SLOTS_BEFORE_FREEZE = 1 << 16


def _gc_policy_callback(phase: str, info: dict[str, int]) -> None:
    global _fresh_table_slots
    if phase == "start" and (
        info["generation"] == 2 or _fresh_table_slots >= FRESH_TABLE_SLOTS_BEFORE_FREEZE
    ):
        _fresh_table_slots = 0
        gc.freeze()


def install_gc_policy() -> None:
    """Keep CPython's collector from walking long-lived state (see the module docstring).

    Before each full collection, and before a young one that would walk more than
    ``FRESH_TABLE_SLOTS_BEFORE_FREEZE`` bucket-array slots allocated since (doubled tables,
    arrays copied after a snapshot), call :func:`gc.freeze` (O(1)): the collection then walks
    nothing. Other young collections are unaffected. Idempotent. State maps create no reference
    cycles, so reference counting still frees everything they drop, frozen or not.
    """
    if _gc_policy_callback not in gc.callbacks:
        gc.callbacks.append(_gc_policy_callback)


def uninstall_gc_policy() -> None:
    """Undo :func:`install_gc_policy` (frozen objects stay frozen until ``gc.unfreeze()``)."""
    while _gc_policy_callback in gc.callbacks:
        gc.callbacks.remove(_gc_policy_callback)
