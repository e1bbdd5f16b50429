"""The write-back cache in front of RocksDB.

A call into RocksDB from Python costs microseconds, and list, reducing and aggregating state are
read-modify-write (rocksdict has no merge operator). The cache keeps recently used entries as
Python objects owned by the cache, and the entries written since the last flush as *dirty*.

Layout, like the heap backend's state tables: one dict per key group of the backend's range,
keyed by the key itself (states in the void namespace) or by ``(key, namespace)``. A cache hit
therefore serializes nothing and builds no composite key; composite keys are built on a miss
(to read RocksDB) and when a dirty entry is flushed. Past the last key group sits a guard whose
lookups raise :class:`~streamstate.errors.NoCurrentKeyError` (and, once the backend is disposed,
every dict is replaced by a guard raising :class:`~streamstate.errors.StateBackendError`).

A flush writes every dirty entry of every state in **one** ``WriteBatch``, so it is atomic
across column families. The cache flushes

* at every checkpoint (synchronous phase, before the native RocksDB checkpoint) and before every
  scan of RocksDB (``get_keys``, ``num_entries``); map iteration merges RocksDB and the cache;
* at a *record boundary* (the backend's current key changes) when it holds more than
  ``capacity`` entries: every write of the previous records is complete then, so a flush never
  contains part of a record. Afterwards the older half of the entries is evicted.

Each state's cache also keeps how many entries its column family holds (``stored``, counted as
``streamstate.format.entries`` counts them: a value per (key, namespace), a mapping, a list's
elements): counted by one scan when first asked, then kept by every flush, which reads the dirty
entries' stored versions in one multi-get before it writes them (O(changes) per flush).

Crash semantics: the local database is never a recovery source (state is restored from the last
complete checkpoint), so a crash loses exactly the work since that checkpoint, cached or not.

Values are copied on the way in and out for mutable types (``serializer.copy``), so user code
never shares an object with the cache; immutable values (ints, strings, frozen records) are
stored as they are and serialized only when flushed.
"""

from __future__ import annotations

import struct
from functools import partial
from itertools import islice
from typing import Any

from rocksdict import WriteBatch

from streamstate.backends.rocksdb.instance import ColumnFamily, RocksDBInstance
from streamstate.backends.rocksdb.keys import KeyLayout
from streamstate.errors import NoCurrentKeyError, StateBackendError
from streamstate.serializers.builtins import Int64Serializer

_INT64 = struct.Struct(">q")
#: Int64Serializer.deserialize without its Python frame (8 bytes big-endian, signed)
_int64_from_bytes = partial(int.from_bytes, byteorder="big", signed=True)

__all__ = [
    "ABSENT",
    "MISS",
    "MapCache",
    "MapView",
    "ValueCache",
    "WriteBackCache",
    "msgpack_array_length",
]


class _Marker:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


MISS: Any = _Marker("MISS")
"""Returned by dict lookups when the cache knows nothing about an entry."""

ABSENT: Any = _Marker("ABSENT")
"""A cached entry that does not exist in RocksDB (a dirty ABSENT is a pending delete)."""


class _Guard(dict):  # type: ignore[type-arg]
    """Stands in for a key group's dict: every lookup raises."""

    __slots__ = ("_error",)

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self._error = error

    def _fail(self, *_: Any) -> Any:
        raise self._error

    get = __getitem__ = __setitem__ = __contains__ = pop = setdefault = _fail  # type: ignore[assignment]


def _no_key_guard(name: str) -> _Guard:
    return _Guard(
        NoCurrentKeyError(
            f"state {name!r} was accessed with no current key set; keyed state can only be used "
            "while processing a record or timer of a key (or after set_current_key)"
        )
    )


def _disposed_guard(name: str) -> _Guard:
    return _Guard(
        StateBackendError(f"state {name!r}: this rocksdb keyed state backend was disposed")
    )


class _StateCache:
    """Shared parts: the column family, the layout, per-key-group dicts, the dirty set."""

    __slots__ = (
        "_start",
        "cf",
        "count",
        "deleted",
        "dirty",
        "entries",
        "layout",
        "name",
        "raw_get",
        "stored",
        "stored_change",
        "void",
    )

    def __init__(self, cf: ColumnFamily, layout: KeyLayout, start: int, num_key_groups: int):
        self.cf = cf
        self.name = cf.name
        #: RocksDB point read of the column family (the miss path; detached on dispose)
        self.raw_get = cf.get_function()
        self.layout = layout
        self.void = layout.ns_void
        self._start = start
        #: per key group index: cache key -> owned object / ABSENT (ValueCache) or MapView
        self.entries: list[dict[Any, Any]] = [{} for _ in range(num_key_groups)]
        self.entries.append(_no_key_guard(self.name))
        #: (key group index, cache key) of the entries to write at the next flush
        self.dirty: set[tuple[int, Any]] = set()
        #: cached entries (approximate between evictions; the budget unit)
        self.count = 0
        #: deletions written by flushes so far (state figures: rows removed)
        self.deleted = 0
        #: the state's entries in RocksDB (``streamstate.format.entries``); None until counted
        #: (:meth:`stored_entries`), then kept by every flush
        self.stored: int | None = None
        #: the change to ``stored`` of the flush being written (applied once it is written)
        self.stored_change = 0

    def composite(self, kg_index: int, cache_key: Any) -> bytes:
        """The RocksDB key (without user key) of a cache key."""
        layout = self.layout
        if self.void:
            return layout.key_prefix(kg_index + self._start, cache_key)
        key, namespace = cache_key
        return layout.key_prefix(kg_index + self._start, key) + layout.namespace_bytes(namespace)

    def size(self) -> int:
        return self.count

    def stored_entries(self) -> int:
        """The state's entries in RocksDB (flush first to include the cache's): counted by one
        scan of the column family the first time (O(entries)), then kept by the flushes."""
        if self.stored is None:
            self.stored = self.count_stored()
        return self.stored

    def count_stored(self) -> int:
        """The entries of the column family, by a scan (one per RocksDB key)."""
        return sum(1 for _ in self.cf.scan_keys(b""))

    def apply_stored_change(self) -> None:
        """The flush was written: its entries count."""
        if self.stored is not None:
            self.stored += self.stored_change
        self.stored_change = 0

    def _groups(self) -> list[dict[Any, Any]]:
        return self.entries[:-1]

    def recount(self) -> int:
        """The exact number of cached entries (O(entries of the state's cache))."""
        self.count = sum(len(d) for d in self._groups())
        return self.count

    def evict(self, keep: int) -> None:
        """Drop the oldest clean entries of every key group until about ``keep`` remain."""
        total = self.recount()
        if total <= keep:
            return
        dirty = self.dirty
        fraction = 1 - keep / total
        for kgi, d in enumerate(self._groups()):
            drop = int(len(d) * fraction + 0.5)
            if drop:
                for ck in [k for k in islice(d, drop) if (kgi, k) not in dirty]:
                    del d[ck]
        self.recount()

    def clear(self) -> None:
        for d in self._groups():
            d.clear()
        self.dirty.clear()
        self.count = 0

    def dispose(self) -> None:
        """Make every later access fail (state handles may outlive the backend)."""
        self.clear()
        guard = _disposed_guard(self.name)
        self.entries[:] = [guard] * len(self.entries)
        self.raw_get = guard._fail
        self.cf.detach()


class ValueCache(_StateCache):
    """Cached entries of one state stored as one RocksDB value per (key, namespace).

    Complexity: a hit is one list index and one dict lookup; a miss adds one RocksDB point read
    and one deserialization; a flush costs one serialization and one batch put per dirty entry.
    """

    __slots__ = ("deserialize", "elements", "serialize")

    def __init__(
        self,
        cf: ColumnFamily,
        layout: KeyLayout,
        start: int,
        num_key_groups: int,
        serialize: Any,
        deserialize: Any,
        *,
        elements: bool = False,
    ) -> None:
        super().__init__(cf, layout, start, num_key_groups)
        #: a list state: each stored value counts its elements as entries
        self.elements = elements
        # int64 values (counters, sums) skip the serializer's method frame on every miss and
        # flush: the struct's own C methods are the same encoding
        owner = getattr(serialize, "__self__", None)
        if type(owner) is Int64Serializer and getattr(deserialize, "__self__", None) is owner:
            serialize = _INT64.pack
            deserialize = _int64_from_bytes
        self.serialize = serialize
        self.deserialize = deserialize

    def load(self, kg_index: int, cache_key: Any, raw_key: bytes) -> Any:
        """The miss path: read ``raw_key`` from RocksDB and cache what was found."""
        raw = self.raw_get(raw_key)
        v = ABSENT if raw is None else self.deserialize(raw)
        self.entries[kg_index][cache_key] = v
        self.count += 1
        return v

    def count_stored(self) -> int:
        if not self.elements:
            return super().count_stored()
        return sum(msgpack_array_length(raw) for _, raw in self.cf.scan(b""))

    def write_dirty(self, batch: WriteBatch) -> int:
        entries = self.entries
        handle = self.cf.handle
        serialize = self.serialize
        counting = self.stored is not None
        written: list[bytes] = []
        now = 0
        composite = self.composite
        layout = self.layout
        # the common layout (void namespace, fixed-length key) builds each key inline: two
        # Python frames less per dirty entry than composite() -> key_prefix()
        fast = self.void and layout.key_fixed >= 0
        kg_prefixes = layout.kg_prefixes[self._start :]
        key_bytes = layout._key_bytes
        for kgi, ck in self.dirty:
            v = entries[kgi][ck]
            if fast:
                try:
                    raw_key = kg_prefixes[kgi] + key_bytes(ck)
                except Exception:  # let key_prefix name the key and the serializer
                    raw_key = composite(kgi, ck)
            else:
                raw_key = composite(kgi, ck)
            if counting:
                written.append(raw_key)
                if v is not ABSENT:
                    now += len(v) if self.elements else 1
            if v is ABSENT:
                batch.delete(raw_key, handle)
                self.deleted += 1
                continue
            try:
                raw = serialize(v)
            except Exception as exc:
                raise StateBackendError(
                    f"state {self.name!r}: cannot serialize {v!r} for RocksDB: {exc}"
                ) from exc
            batch.put(raw_key, raw, handle)
        if counting and self.stored is not None:
            # the versions the batch replaces (it is written after every cache built its part)
            before = self.cf.multi_get(written)
            if self.elements:
                was = sum(msgpack_array_length(raw) for raw in before if raw is not None)
            else:
                was = sum(raw is not None for raw in before)
            self.stored_change = now - was
        return len(self.dirty)

    def mark_clean(self) -> None:
        self.dirty.clear()
        self.apply_stored_change()


class MapView:
    """What the cache knows about the map of one (key, namespace).

    ``items``: user key -> owned value or :data:`ABSENT`; ``complete``: every mapping stored in
    RocksDB is also in ``items`` (so a miss means absent); ``dirty``: user keys to write (None
    while clean: one container less per cached map); ``prefix``: the composite key of the map
    (computed on first need).
    """

    __slots__ = ("complete", "dirty", "items", "prefix")

    def __init__(self) -> None:
        self.items: dict[Any, Any] = {}
        self.dirty: set[Any] | None = None
        self.complete = False
        self.prefix: bytes | None = None


class MapCache(_StateCache):
    """Cached maps of one MapState: per key group, cache key -> :class:`MapView`.

    RocksDB stores one key per mapping: ``prefix + serialized user key``. Complexity: a point
    operation on a cached mapping is O(1); a miss reads one RocksDB key; iterating a map that is
    not complete yet scans its prefix once (O(mappings)), after which it is served from memory.
    """

    __slots__ = ("deserialize_key", "deserialize_value", "serialize_key", "serialize_value")

    def __init__(
        self,
        cf: ColumnFamily,
        layout: KeyLayout,
        start: int,
        num_key_groups: int,
        serialize_key: Any,
        deserialize_key: Any,
        serialize_value: Any,
        deserialize_value: Any,
    ) -> None:
        super().__init__(cf, layout, start, num_key_groups)
        self.serialize_key = serialize_key
        self.deserialize_key = deserialize_key
        self.serialize_value = serialize_value
        self.deserialize_value = deserialize_value

    def new_view(self, kg_index: int, cache_key: Any) -> MapView:
        v = self.entries[kg_index][cache_key] = MapView()
        self.count += 1
        return v

    def prefix(self, kg_index: int, cache_key: Any, view: MapView) -> bytes:
        p = view.prefix
        if p is None:
            p = view.prefix = self.composite(kg_index, cache_key)
        return p

    def load(self, kg_index: int, cache_key: Any, view: MapView, user_key: Any) -> Any:
        """The miss path of one user key."""
        if view.complete:
            v = ABSENT
        else:
            prefix = self.prefix(kg_index, cache_key, view)
            raw = self.raw_get(prefix + self.serialize_key(user_key))
            v = ABSENT if raw is None else self.deserialize_value(raw)
        view.items[user_key] = v
        self.count += 1
        return v

    def load_all(self, kg_index: int, cache_key: Any, view: MapView) -> None:
        """Make ``view`` complete: read every stored mapping not already known."""
        if view.complete:
            return
        prefix = self.prefix(kg_index, cache_key, view)
        items = view.items
        before = len(items)
        n = len(prefix)
        dk, dv = self.deserialize_key, self.deserialize_value
        for raw_key, raw_value in self.cf.scan_prefix(prefix):
            uk = dk(raw_key[n:])
            if uk not in items:
                items[uk] = dv(raw_value)
        view.complete = True
        self.count += len(items) - before

    def has_stored_mapping(self, kg_index: int, cache_key: Any, view: MapView) -> bool:
        """Whether RocksDB holds a mapping of the view that the view has not removed."""
        prefix = self.prefix(kg_index, cache_key, view)
        n = len(prefix)
        items = view.items
        dk = self.deserialize_key
        for raw_key in self.cf.scan_prefix_keys(prefix):
            if items.get(dk(raw_key[n:]), MISS) is not ABSENT:
                return True
        return False

    def write_dirty(self, batch: WriteBatch) -> int:
        entries = self.entries
        handle = self.cf.handle
        sk, sv = self.serialize_key, self.serialize_value
        counting = self.stored is not None
        written: list[bytes] = []
        now = 0
        n = 0
        for kgi, ck in self.dirty:
            view = entries[kgi][ck]
            prefix = self.prefix(kgi, ck, view)
            items = view.items
            for uk in view.dirty or ():
                v = items[uk]
                try:
                    raw_key = prefix + sk(uk)
                    if v is ABSENT:
                        batch.delete(raw_key, handle)
                        self.deleted += 1
                    else:
                        batch.put(raw_key, sv(v), handle)
                        now += 1
                except Exception as exc:
                    raise StateBackendError(
                        f"map state {self.name!r}: cannot serialize mapping {uk!r} -> {v!r} for "
                        f"RocksDB: {exc}"
                    ) from exc
                if counting:
                    written.append(raw_key)
                n += 1
        if counting and self.stored is not None:
            before = self.cf.multi_get(written)
            self.stored_change = now - sum(raw is not None for raw in before)
        return n

    def mark_clean(self) -> None:
        entries = self.entries
        for kgi, ck in self.dirty:
            entries[kgi][ck].dirty = None
        self.dirty.clear()
        self.apply_stored_change()

    def recount(self) -> int:
        self.count = sum(len(v.items) + 1 for d in self._groups() for v in d.values())
        return self.count


def msgpack_array_length(raw: bytes) -> int:
    """The number of elements of the msgpack array ``raw`` begins with (a list state's stored
    value), read from its header.

    >>> import msgspec
    >>> [msgpack_array_length(msgspec.msgpack.encode(list(range(n)))) for n in (0, 3, 16, 70000)]
    [0, 3, 16, 70000]
    """
    head = raw[0]
    if 0x90 <= head <= 0x9F:
        return head & 0x0F
    if head == 0xDC:
        return int.from_bytes(raw[1:3], "big")
    if head == 0xDD:
        return int.from_bytes(raw[1:5], "big")
    raise StateBackendError(f"a list state's stored value is not a msgpack array ({raw[:8]!r})")


class WriteBackCache:
    """The budget and the atomic flush of every state cache of one backend.

    ``capacity`` is in entries (cached values, map mappings and map views). With capacity 0 the
    cache still exists but is flushed and emptied at every record boundary.
    """

    __slots__ = (
        "_caches",
        "_countdown",
        "capacity",
        "check_every",
        "evictions",
        "flushes",
        "instance",
        "written",
    )

    def __init__(self, instance: RocksDBInstance, capacity: int) -> None:
        self.instance = instance
        self.capacity = capacity
        #: record boundaries between two size checks (bounds the overshoot, keeps checks cheap)
        self.check_every = 1 if capacity < 1024 else 64
        self._countdown = self.check_every
        self._caches: list[ValueCache | MapCache] = []
        self.flushes = 0
        self.evictions = 0
        #: entries (and map mappings) written or deleted by flushes so far
        self.written = 0

    def register(self, cache: ValueCache | MapCache) -> None:
        self._caches.append(cache)

    def size(self) -> int:
        return sum(c.count for c in self._caches)

    def at_record_boundary(self, _key: Any = None) -> None:
        """Called before every key change (a ``key_selected_listener`` of the backend)."""
        self._countdown -= 1
        if self._countdown > 0:
            return
        self._countdown = self.check_every
        if self.size() > self.capacity:
            self.flush()
            self.evict()

    def flush(self) -> int:
        """Write every dirty entry of every state in one atomic WriteBatch; returns how many."""
        batch = self.instance.new_batch()
        n = 0
        for c in self._caches:
            if c.dirty:
                n += c.write_dirty(batch)
        if n:
            self.instance.write(batch)
            self.flushes += 1
            self.written += n
        for c in self._caches:
            if c.dirty:
                c.mark_clean()
        return n

    def deleted(self) -> int:
        """Deletions written by flushes so far, over every state."""
        return sum(c.deleted for c in self._caches)

    def evict(self) -> None:
        """Keep about half the capacity, spread over the states in proportion to their size.

        Only clean entries are evicted (call :meth:`flush` first to make everything clean).
        """
        total = self.size()
        if total == 0:
            return
        target = self.capacity // 2
        for c in self._caches:
            c.evict(c.count * target // total)
        self.evictions += 1

    def clear(self) -> None:
        """Forget every cached entry, dirty ones included."""
        for c in self._caches:
            c.clear()

    def dispose(self) -> None:
        for c in self._caches:
            c.dispose()
        self._caches.clear()
