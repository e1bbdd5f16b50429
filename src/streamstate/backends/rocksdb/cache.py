"""The write-back cache in front of RocksDB.

A call into RocksDB from Python costs a microsecond or two, and list, reducing and aggregating
state are read-modify-write (rocksdict has no merge operator). The cache keeps recently used
entries as Python objects owned by the cache, and the entries written since the last flush as
*dirty*. A flush writes every dirty entry of every state in **one** ``WriteBatch``, so it is
atomic across column families.

When the cache flushes:

* at every checkpoint (synchronous phase, before the native RocksDB checkpoint);
* before every scan of RocksDB (``get_keys``, ``num_entries``, map iteration is merged instead);
* at a *record boundary* when it holds more than ``capacity`` entries. The boundary is the first
  state access after the current key changed; every write of the previous records is complete
  then, so a flush never contains part of a record. Afterwards the older half of the entries is
  evicted.

Crash semantics: the local database is never a recovery source (state is restored from the last
complete checkpoint), so a crash loses exactly the work since that checkpoint, cached or not.

Values are copied on the way in and out for mutable types (``serializer.copy``), so user code
never shares an object with the cache; immutable values (ints, strings, frozen records) are
stored as they are and serialized only when flushed.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

from rocksdict import WriteBatch

from streamstate.backends.rocksdb.instance import ColumnFamily, RocksDBInstance
from streamstate.errors import StateBackendError

__all__ = ["ABSENT", "MISS", "MapCache", "MapView", "ValueCache", "WriteBackCache"]


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


class ValueCache:
    """Cached entries of one state stored as one RocksDB value per composite key.

    ``entries``: composite key -> owned object or :data:`ABSENT`; ``dirty``: keys to write.
    """

    __slots__ = ("cf", "deserialize", "dirty", "entries", "name", "serialize")

    def __init__(self, cf: ColumnFamily, serialize: Any, deserialize: Any) -> None:
        self.cf = cf
        self.name = cf.name
        self.serialize = serialize
        self.deserialize = deserialize
        self.entries: dict[bytes, Any] = {}
        self.dirty: set[bytes] = set()

    def load(self, ck: bytes) -> Any:
        """The miss path: read ``ck`` from RocksDB and cache what was found."""
        raw = self.cf.get(ck)
        v = ABSENT if raw is None else self.deserialize(raw)
        self.entries[ck] = v
        return v

    def size(self) -> int:
        return len(self.entries)

    def write_dirty(self, batch: WriteBatch) -> int:
        entries = self.entries
        handle = self.cf.handle
        serialize = self.serialize
        n = 0
        for ck in self.dirty:
            v = entries[ck]
            if v is ABSENT:
                batch.delete(ck, handle)
            else:
                try:
                    raw = serialize(v)
                except Exception as exc:
                    raise StateBackendError(
                        f"state {self.name!r}: cannot serialize {v!r} for RocksDB: {exc}"
                    ) from exc
                batch.put(ck, raw, handle)
            n += 1
        return n

    def mark_clean(self) -> None:
        self.dirty.clear()

    def evict(self, keep: int) -> None:
        """Drop the oldest clean entries until at most ``keep`` remain."""
        entries = self.entries
        drop = len(entries) - keep
        if drop <= 0:
            return
        dirty = self.dirty
        for ck in [k for k in islice(entries, drop) if k not in dirty]:
            del entries[ck]

    def clear(self) -> None:
        self.entries.clear()
        self.dirty.clear()


class MapView:
    """What the cache knows about the map of one (key, namespace).

    ``items``: user key -> owned value or :data:`ABSENT`; ``complete``: every mapping stored in
    RocksDB is also in ``items`` (so a miss means absent); ``dirty``: user keys to write.
    """

    __slots__ = ("complete", "dirty", "items")

    def __init__(self) -> None:
        self.items: dict[Any, Any] = {}
        self.dirty: set[Any] = set()
        self.complete = False


class MapCache:
    """Cached map entries of one MapState: entry prefix (kg, key, ns) -> :class:`MapView`.

    RocksDB stores one key per user key: ``prefix + serialized user key``.
    """

    __slots__ = (
        "cf",
        "count",
        "deserialize_key",
        "deserialize_value",
        "name",
        "serialize_key",
        "serialize_value",
        "views",
    )

    def __init__(
        self,
        cf: ColumnFamily,
        serialize_key: Any,
        deserialize_key: Any,
        serialize_value: Any,
        deserialize_value: Any,
    ) -> None:
        self.cf = cf
        self.name = cf.name
        self.serialize_key = serialize_key
        self.deserialize_key = deserialize_key
        self.serialize_value = serialize_value
        self.deserialize_value = deserialize_value
        self.views: dict[bytes, MapView] = {}
        #: cached user keys over all views plus one per view (the budget unit)
        self.count = 0

    def view(self, prefix: bytes) -> MapView:
        v = self.views.get(prefix)
        if v is None:
            v = self.views[prefix] = MapView()
            self.count += 1
        return v

    def load(self, view: MapView, prefix: bytes, user_key: Any) -> Any:
        """The miss path of one user key."""
        if view.complete:
            v = ABSENT
        else:
            raw = self.cf.get(prefix + self.serialize_key(user_key))
            v = ABSENT if raw is None else self.deserialize_value(raw)
        view.items[user_key] = v
        self.count += 1
        return v

    def load_all(self, view: MapView, prefix: bytes) -> None:
        """Make ``view`` complete: read every stored mapping not already known."""
        if view.complete:
            return
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

    def first_stored_key(self, view: MapView, prefix: bytes) -> bool:
        """Whether RocksDB holds a mapping of ``prefix`` that ``view`` has not removed."""
        n = len(prefix)
        items = view.items
        dk = self.deserialize_key
        for raw_key, _ in self.cf.scan(prefix, _successor(prefix), keys_only=True):
            if items.get(dk(raw_key[n:]), MISS) is not ABSENT:
                return True
        return False

    def size(self) -> int:
        return self.count

    def write_dirty(self, batch: WriteBatch) -> int:
        handle = self.cf.handle
        sk, sv = self.serialize_key, self.serialize_value
        n = 0
        for prefix, view in self.views.items():
            if not view.dirty:
                continue
            items = view.items
            for uk in view.dirty:
                v = items[uk]
                try:
                    ck = prefix + sk(uk)
                    if v is ABSENT:
                        batch.delete(ck, handle)
                    else:
                        batch.put(ck, sv(v), handle)
                except StateBackendError:
                    raise
                except Exception as exc:
                    raise StateBackendError(
                        f"map state {self.name!r}: cannot serialize mapping {uk!r} -> {v!r} for "
                        f"RocksDB: {exc}"
                    ) from exc
                n += 1
        return n

    def mark_clean(self) -> None:
        for view in self.views.values():
            if view.dirty:
                view.dirty.clear()

    def evict(self, keep: int) -> None:
        """Drop the oldest clean views until at most ``keep`` entries remain."""
        views = self.views
        excess = self.count - keep
        if excess <= 0:
            return
        victims = []
        for prefix, view in views.items():
            if excess <= 0:
                break
            if view.dirty:
                continue
            victims.append(prefix)
            excess -= len(view.items) + 1
        for prefix in victims:
            self.count -= len(views.pop(prefix).items) + 1

    def clear(self) -> None:
        self.views.clear()
        self.count = 0


def _successor(prefix: bytes) -> bytes | None:
    from streamstate.backends.rocksdb.keys import prefix_successor

    return prefix_successor(prefix)


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

    def register(self, cache: ValueCache | MapCache) -> None:
        self._caches.append(cache)

    def unregister_all(self) -> None:
        self._caches.clear()

    def size(self) -> int:
        return sum(c.size() for c in self._caches)

    def dirty_count(self) -> int:
        n = 0
        for c in self._caches:
            if isinstance(c, ValueCache):
                n += len(c.dirty)
            else:
                n += sum(len(v.dirty) for v in c.views.values())
        return n

    def at_record_boundary(self) -> None:
        """Called on the first state access after a key change."""
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
            n += c.write_dirty(batch)
        if n:
            self.instance.write(batch)
            for c in self._caches:
                c.mark_clean()
            self.flushes += 1
        return n

    def evict(self) -> None:
        """Keep about half the capacity, spread over the states in proportion to their size.

        Only clean entries are evicted (call :meth:`flush` first to make everything clean).
        """
        total = self.size()
        if total == 0:
            return
        target = self.capacity // 2
        for c in self._caches:
            c.evict(c.size() * target // total)
        self.evictions += 1

    def clear(self) -> None:
        """Forget every cached entry, dirty ones included (dispose, restore)."""
        for c in self._caches:
            c.clear()
