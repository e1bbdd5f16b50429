"""Timer queues owned by a keyed backend (SPEC §9; Flink's ``PriorityQueueSetFactory``).

A keyed backend creates its timer queues (:meth:`KeyedStateBackend.create_timer_queue
<streamstate.backends.base.KeyedStateBackend.create_timer_queue>`), snapshots them with its
states and restores them itself: a timer queue is one more registered state, the pseudo-state
``_timers.<service>.<domain>`` of kind ``"timer"`` whose entries are ``(key, namespace,
timestamp)``. A timer service (``streamstate/timers.py``) only asks the backend for its queues.

A restore fills the queues at once, key group by key group, so restored timers follow their key
group on rescale. Their namespaces are decoded with the queue's serializer: the one the program
gave (a queue created before the restore) or, for a queue not created yet, the checkpoint's if it
can be rebuilt without running code (built-in and window serializers). Only otherwise does a
queue keep its restored namespaces encoded, as restored states do, until the program creates it.

>>> q = KeyGroupedTimerQueue(num_key_groups=2)
>>> q.add(20, "b", None, 1), q.add(10, "a", None, 0), q.add(10, "a", None, 0)
(True, True, False)
>>> q.poll(), q.poll(), q.poll()
((10, 'a', None, 0), (20, 'b', None, 1), None)

Complexity, with ``t`` distinct timestamps: ``add`` O(1) for a timestamp already held, O(log t)
for a new one; ``remove`` O(1) amortized (lazy: the entry is skipped when it surfaces);
``peek``/``poll`` amortized O(1), plus O(log t) when a timestamp's last timer goes.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Iterable, Iterator
from operator import itemgetter
from typing import Any, Literal

import msgspec

from streamstate.errors import (
    CorruptCheckpointError,
    KeyGroupOutOfRangeError,
    StateMigrationException,
)
from streamstate.format.codec import UNREADABLE, StateCodec
from streamstate.format.meta import TIMER_STATE_KIND, StateMetaInfo, StateMetaSnapshot
from streamstate.format.restore import (
    RestoredBlock,
    RestoredSerializer,
    expand_namespaces,
    is_builtin_snapshot,
)
from streamstate.format.snapshot import DeltaEntries, EntryColumns, SnapshotSource
from streamstate.keygroups import KeyGroupRange
from streamstate.serializers import Int64Serializer, serializer_from_snapshot
from streamstate.serializers.base import SerializerSnapshot, TypeSerializer

__all__ = [
    "KeyGroupedTimerQueue",
    "TimerQueueState",
    "TimerQueues",
    "TimerRestore",
]

_first, _second, _third = itemgetter(0), itemgetter(1), itemgetter(2)

#: namespace serializers a restore rebuilds from the checkpoint without running its code, so that
#: the timers of a queue not created yet are decoded at once (window namespaces are the usual)
_REBUILT_NAMESPACE_TYPES = frozenset({"time_window", "global_window"})

#: how the namespaces of a queue that keeps them encoded are encoded: "wire" (msgpack of the wire
#: value, as in snapshot files) or "bytes" (the serializer's bytes, as in RocksDB manifests)
EncodedForm = Literal["wire", "bytes"]


class KeyGroupedTimerQueue:
    """A priority queue of timers with set semantics, partitioned by key group.

    Timers with equal timestamps come out in the order they were added. They are kept in one
    bucket per distinct timestamp, in a heap of those timestamps: window timers share few
    timestamps (every key's hour ends at the same instant), so adding and polling cost a dict
    lookup and a deque step instead of a sift through a heap of every timer.
    """

    __slots__ = ("_buckets", "_by_kg", "_entries", "_seq", "_size", "_times", "changed")

    #: compact the buckets once they hold this many more entries than twice the live timers
    COMPACT_SLACK = 64

    def __init__(self, num_key_groups: int) -> None:
        # per key group: (timestamp, key, namespace) -> sequence number of its live entry
        self._by_kg: list[dict[tuple[int, Any, Any], int]] = [{} for _ in range(num_key_groups)]
        # timestamp -> entries (sequence number, key group, key, namespace) in the order added;
        # the entry of a removed timer stays until it surfaces or a compaction
        self._buckets: dict[int, deque[tuple[int, int, Any, Any]]] = {}
        # the timestamps of the buckets, as a heap
        self._times: list[int] = []
        self._entries = 0
        self._seq = itertools.count()
        self._size = 0
        #: indices of key groups whose timers changed since the last take_changed()
        self.changed: set[int] = set()

    def add(self, timestamp: int, key: Any, namespace: Any, kg_index: int) -> bool:
        """Add a timer; False if it was already there."""
        timers = self._by_kg[kg_index]
        ident = (timestamp, key, namespace)
        if ident in timers:
            return False
        seq = next(self._seq)
        timers[ident] = seq
        self._size += 1
        bucket = self._buckets.get(timestamp)
        if bucket is None:
            self._buckets[timestamp] = bucket = deque()
            heapq.heappush(self._times, timestamp)
        bucket.append((seq, kg_index, key, namespace))
        self._entries += 1
        self.changed.add(kg_index)
        return True

    def remove(self, timestamp: int, key: Any, namespace: Any, kg_index: int) -> bool:
        """Remove a timer; False if it was not there.

        Its entry is dropped lazily (when it surfaces, or by a compaction once removed
        entries outnumber live ones), so removal is O(1) amortized.
        """
        if self._by_kg[kg_index].pop((timestamp, key, namespace), None) is None:
            return False
        self._size -= 1
        self.changed.add(kg_index)
        if self._entries > 2 * self._size + self.COMPACT_SLACK:
            self.compact()
        return True

    def contains(self, timestamp: int, key: Any, namespace: Any, kg_index: int) -> bool:
        return (timestamp, key, namespace) in self._by_kg[kg_index]

    def take_changed(self) -> set[int]:
        """Indices of key groups whose timers changed since the last call (incremental
        checkpoints write only those key groups' timers)."""
        changed = self.changed
        self.changed = set()
        return changed

    def peek_timestamp(self) -> int | None:
        """The smallest timestamp of any timer, or None (entries of removed timers at the
        front are dropped)."""
        times = self._times
        buckets = self._buckets
        by_kg = self._by_kg
        while times:
            ts = times[0]
            bucket = buckets[ts]
            while bucket:
                seq, kgi, key, ns = bucket[0]
                if by_kg[kgi].get((ts, key, ns)) == seq:
                    return ts
                bucket.popleft()
                self._entries -= 1
            del buckets[ts]
            heapq.heappop(times)
        return None

    def poll(self) -> tuple[int, Any, Any, int] | None:
        """Remove and return ``(timestamp, key, namespace, kg_index)`` of the earliest timer."""
        return self.poll_until(math.inf)

    def poll_until(self, until: float) -> tuple[int, Any, Any, int] | None:
        """Remove and return ``(timestamp, key, namespace, kg_index)`` of the earliest timer if
        its timestamp is at most ``until``, else None: what :meth:`peek_timestamp` then
        :meth:`poll` would do, in one look (firing a million window timers looked each one up
        three times)."""
        times = self._times
        buckets = self._buckets
        by_kg = self._by_kg
        while times:
            ts = times[0]
            if ts > until:
                return None  # removed or not, every entry after it is later still
            bucket = buckets[ts]
            while bucket:
                seq, kgi, key, ns = bucket.popleft()
                self._entries -= 1
                timers = by_kg[kgi]
                ident = (ts, key, ns)
                if timers.get(ident) == seq:
                    del timers[ident]
                    self._size -= 1
                    self.changed.add(kgi)
                    return ts, key, ns, kgi
            del buckets[ts]
            heapq.heappop(times)
        return None

    def __len__(self) -> int:
        return self._size

    @property
    def num_key_groups(self) -> int:
        return len(self._by_kg)

    def heap_size(self) -> int:
        """Entries held, removed timers not yet dropped included (for tests)."""
        return self._entries

    def timers_of_key_group(self, kg_index: int) -> list[tuple[int, Any, Any]]:
        """``(timestamp, key, namespace)`` of one key group, in the order they were added."""
        return list(self._by_kg[kg_index])

    def __iter__(self) -> Iterator[tuple[int, Any, Any, int]]:
        for kgi, timers in enumerate(self._by_kg):
            for ts, key, ns in timers:
                yield ts, key, ns, kgi

    def compact(self) -> None:
        """Drop the entries of removed timers (bounds memory after many deletions)."""
        live = sorted(
            (seq, ts, kgi, k, ns)
            for kgi, t in enumerate(self._by_kg)
            for (ts, k, ns), seq in t.items()
        )
        buckets: dict[int, deque[tuple[int, int, Any, Any]]] = {}
        for seq, ts, kgi, k, ns in live:
            bucket = buckets.get(ts)
            if bucket is None:
                buckets[ts] = bucket = deque()
            bucket.append((seq, kgi, k, ns))
        self._buckets = buckets
        self._times = list(buckets)
        heapq.heapify(self._times)
        self._entries = len(live)

    def clear(self) -> None:
        """Drop every timer (a queue being refilled with decoded namespaces)."""
        for timers in self._by_kg:
            timers.clear()
        self._buckets = {}
        self._times = []
        self._entries = 0
        self._size = 0


class _TimerSnapshotSource(SnapshotSource):
    """Timers of one queue as a keyed-snapshot source: entries ``(key, namespace, timestamp)``.

    The synchronous part copies each key group's ``(timestamp, key, namespace)`` list (a copy of
    a dict's keys, at C speed); turning it into the file's columns happens in :meth:`entries`,
    which the asynchronous part calls (with a million windows, a Python loop per timer in the
    synchronous part held up every step by ~0.1-0.2 s).
    """

    def __init__(self, meta: StateMetaInfo, per_kg: list[Any], *, delta: bool = False) -> None:
        self.meta = meta
        #: per key group: [(timestamp, key, namespace)], or None (delta: unchanged)
        self._per_kg: list[Any] = per_kg
        #: whether a listed key group replaces the previous checkpoint's (incremental)
        self._delta = delta

    def entries(self, key_group_index: int) -> EntryColumns | DeltaEntries | None:
        timers = self._per_kg[key_group_index]
        if timers is None:
            return None
        if timers:
            # column by column (zip(*timers) would make an iterator per timer)
            columns = EntryColumns(
                list(map(_second, timers)), list(map(_third, timers)), list(map(_first, timers))
            )
        else:
            columns = EntryColumns([], [], [])
        # a delta's changed key group is written even when empty: it replaces the previous one
        return DeltaEntries(columns, None) if self._delta else columns

    def release_key_group(self, key_group_index: int) -> None:
        self._per_kg[key_group_index] = None

    def release(self) -> None:
        self._per_kg = [None] * len(self._per_kg)


class TimerQueueState:
    """One timer queue registered in a keyed backend: its name, namespace serializer and queue.

    ``namespace_serializer`` is None while the queue holds restored namespaces still encoded
    (``encoded_form``), which happens only when the checkpoint's namespace serializer cannot be
    rebuilt without running code and the program has not created the queue yet.
    """

    __slots__ = ("encoded_form", "name", "namespace_serializer", "queue", "restored_snapshot")

    def __init__(
        self,
        name: str,
        num_key_groups: int,
        namespace_serializer: TypeSerializer[Any] | None,
        restored_snapshot: SerializerSnapshot | None = None,
        encoded_form: EncodedForm | None = None,
    ) -> None:
        self.name = name
        self.queue = KeyGroupedTimerQueue(num_key_groups)
        self.namespace_serializer = namespace_serializer
        #: the namespace serializer snapshot of the checkpoint this queue was restored from
        self.restored_snapshot = restored_snapshot
        self.encoded_form = encoded_form

    @property
    def bound(self) -> bool:
        """Whether the namespaces are decoded (the queue can be snapshotted by any backend)."""
        return self.namespace_serializer is not None

    def meta(self) -> StateMetaInfo:
        """The snapshot meta data (a still-encoded queue writes its namespaces as they are)."""
        ns = self.namespace_serializer
        if ns is None:
            assert self.restored_snapshot is not None
            ns = RestoredSerializer(self.restored_snapshot)
        return StateMetaInfo(self.name, TIMER_STATE_KIND, ns, Int64Serializer())

    def check_compatible(self, namespace_serializer: TypeSerializer[Any], snapshot: Any) -> None:
        """Refuse a namespace serializer that cannot read timers written by ``snapshot``."""
        if namespace_serializer.resolve_compatibility(snapshot).is_incompatible:
            raise StateMigrationException(
                f"timer queue {self.name!r}: the namespace serializer {namespace_serializer!r} "
                f"cannot read the checkpointed timers written by {snapshot}"
            )

    def bind(self, namespace_serializer: TypeSerializer[Any]) -> None:
        """The program created the queue with ``namespace_serializer``: check it against the
        checkpoint and decode namespaces kept encoded."""
        if self.restored_snapshot is not None:
            self.check_compatible(namespace_serializer, self.restored_snapshot)
        if self.namespace_serializer is None:
            timers = list(self.queue)
            self.queue.clear()
            encoded = [ns for _, _, ns, _ in timers]
            if self.encoded_form == "wire":
                decoded = RestoredSerializer({}).decode_with(encoded, namespace_serializer)
            else:
                decoded = [namespace_serializer.deserialize(b) for b in encoded]
            for (ts, key, _, kgi), ns in zip(timers, decoded, strict=True):
                self.queue.add(ts, key, ns, kgi)
            self.encoded_form = None
        self.namespace_serializer = namespace_serializer

    def snapshot_source(self) -> SnapshotSource:
        """Synchronous copy of the queue, as a keyed-snapshot source."""
        q = self.queue
        return _TimerSnapshotSource(
            self.meta(), [q.timers_of_key_group(i) for i in range(q.num_key_groups)]
        )

    def delta_snapshot_source(self) -> SnapshotSource:
        """The timers of the key groups whose timers changed since the last delta, each key
        group's complete set replacing the previous one (incremental checkpoints)."""
        q = self.queue
        per_kg: list[Any] = [None] * q.num_key_groups
        for kgi in q.take_changed():
            per_kg[kgi] = q.timers_of_key_group(kgi)
        return _TimerSnapshotSource(self.meta(), per_kg, delta=True)


class TimerQueues:
    """The timer queues of one keyed backend, by pseudo-state name."""

    __slots__ = ("_queues", "key_group_range")

    def __init__(self, key_group_range: KeyGroupRange) -> None:
        self.key_group_range = key_group_range
        self._queues: dict[str, TimerQueueState] = {}

    def create(self, name: str, namespace_serializer: TypeSerializer[Any]) -> KeyGroupedTimerQueue:
        """The queue ``name``, created if new; a restored one is checked against and bound to
        the program's namespace serializer."""
        state = self._queues.get(name)
        if state is None:
            state = TimerQueueState(name, len(self.key_group_range), namespace_serializer)
            self._queues[name] = state
        else:
            state.bind(namespace_serializer)
        return state.queue

    def get(self, name: str) -> TimerQueueState | None:
        return self._queues.get(name)

    def names(self) -> list[str]:
        return list(self._queues)

    def unbound_names(self) -> list[str]:
        """Queues whose restored namespaces are still encoded (not created by the program)."""
        return [n for n, s in self._queues.items() if not s.bound]

    def snapshot_sources(self) -> list[SnapshotSource]:
        return [s.snapshot_source() for s in self._queues.values()]

    def delta_snapshot_sources(self) -> list[SnapshotSource]:
        return [s.delta_snapshot_source() for s in self._queues.values()]

    def reset_changes(self) -> None:
        """Forget which key groups changed (a full snapshot became the new base)."""
        for s in self._queues.values():
            s.queue.take_changed()

    def num_timers(self) -> int:
        return sum(len(s.queue) for s in self._queues.values())

    def clear(self) -> None:
        self._queues.clear()

    def discard(self, name: str) -> None:
        self._queues.pop(name, None)

    def restored_state(
        self,
        meta: StateMetaSnapshot,
        form: EncodedForm,
        serializer: TypeSerializer[Any] | None = None,
    ) -> tuple[TimerQueueState, TypeSerializer[Any] | None]:
        """The queue a restore fills for the checkpointed timer state ``meta`` (created if new)
        and the serializer decoding its namespaces (None: they stay encoded in ``form``).
        ``serializer``: the namespace serializer of timers restored as values (in-memory
        snapshots), which a new queue takes."""
        name = meta.name
        snap = meta.namespace_serializer
        state = self._queues.get(name)
        if state is not None:
            if state.namespace_serializer is not None:
                state.check_compatible(state.namespace_serializer, snap)
                return state, state.namespace_serializer
            if state.restored_snapshot != snap or state.encoded_form != form:
                raise CorruptCheckpointError(
                    f"timer queue {name!r} appears with two namespace serializers in the "
                    "snapshots being restored"
                )
            return state, None
        if serializer is None and (
            is_builtin_snapshot(snap) or snap.get("type") in _REBUILT_NAMESPACE_TYPES
        ):
            serializer = serializer_from_snapshot(snap)
        if serializer is not None:
            state = TimerQueueState(name, len(self.key_group_range), serializer, snap)
            self._queues[name] = state
            return state, serializer
        state = TimerQueueState(name, len(self.key_group_range), None, snap, form)
        self._queues[name] = state
        return state, None


class TimerRestore:
    """Collects the checkpointed timers of a restore and installs them into the backend's
    queues once everything was read (a restore is all or nothing).

    Timers are replaced per key group and queue by every full block or delta (the snapshots
    write each changed key group's complete set).
    """

    def __init__(self, queues: TimerQueues, key_serializer: TypeSerializer[Any]) -> None:
        self.queues = queues
        self.key_serializer = key_serializer
        self._range = queues.key_group_range
        #: per queue name: the queue, and per key group index {(ts, key, ns): None}
        self._timers: dict[str, tuple[TimerQueueState, list[dict[Any, None] | None]]] = {}
        self._codecs: dict[str, Any] = {}
        #: queues this restore created (dropped again if it fails)
        self._created: list[str] = []

    def _slot(
        self,
        meta: StateMetaSnapshot,
        key_group: int,
        form: EncodedForm,
        serializer: TypeSerializer[Any] | None = None,
    ) -> dict[Any, None]:
        name = meta.name
        entry = self._timers.get(name)
        if entry is None:
            if self.queues.get(name) is None:
                self._created.append(name)
            state, _ = self.queues.restored_state(meta, form, serializer)
            entry = self._timers[name] = (state, [None] * len(self._range))
        if not self._range.contains(key_group):
            raise KeyGroupOutOfRangeError(
                f"timer queue {name!r}: a checkpointed timer belongs to key group {key_group}, "
                f"outside this backend's range {self._range}"
            )
        per_kg = entry[1]
        index = key_group - self._range.start
        current = per_kg[index]
        if current is None:
            current = per_kg[index] = {}
        return current

    def add_block(self, block: RestoredBlock, where: str) -> None:
        """A timer block of a snapshot file (entries section, see docs/formats.md)."""
        meta = block.state
        name = meta.name
        current = self._slot(meta, block.key_group, "wire")
        codec = self._codecs.get(name)
        if codec is None:
            state = self._timers[name][0]
            ns = state.namespace_serializer
            if ns is None:
                ns = RestoredSerializer(meta.namespace_serializer)
            codec = self._codecs[name] = StateCodec(self.key_serializer, ns, Int64Serializer())
        try:
            keys, nss, stamps = codec.decode(block.entries)
            namespaces = expand_namespaces(nss, len(keys))
            gone: list[tuple[Any, Any]] = []
            if block.removed is not None:
                gone_keys, gone_nss = codec.decode_removed(block.removed)
                gone = list(
                    zip(gone_keys, expand_namespaces(gone_nss, len(gone_keys)), strict=True)
                )
        except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as exc:
            raise CorruptCheckpointError(
                f"{where}: timers {name!r}, key group {block.key_group}: {exc}"
            ) from None
        if block.removed is None:
            current.clear()  # a full set replaces the key group's timers
        for k, ns in gone:
            for ident in [t for t in current if t[1] == k and t[2] == ns]:
                del current[ident]
        for k, ns, ts in zip(keys, namespaces, stamps, strict=True):
            current[(int(ts), k, ns)] = None

    def add_timers(
        self, meta: StateMetaInfo, key_group: int, timers: Iterable[tuple[Any, Any, Any]]
    ) -> None:
        """Decoded ``(key, namespace, timestamp)`` timers of one key group (in-memory keyed
        snapshots: their namespaces are values of ``meta.namespace_serializer``)."""
        current = self._slot(meta.snapshot(), key_group, "wire", meta.namespace_serializer)
        for key, ns, ts in timers:
            current[(int(ts), key, ns)] = None

    def add_native(
        self, meta: StateMetaSnapshot, entries: Iterable[tuple[int, bytes, bytes, int]]
    ) -> None:
        """Timers ``(key group, key bytes, namespace bytes, timestamp)`` of a RocksDB manifest
        (serializer bytes); key groups outside this backend's range are skipped (rescaling)."""
        name = meta.name
        key = self.key_serializer.deserialize
        decode_ns = None
        for kg, raw_key, raw_ns, ts in entries:
            if not self._range.contains(kg):
                continue
            current = self._slot(meta, kg, "bytes")
            if decode_ns is None:
                ns_serializer = self._timers[name][0].namespace_serializer
                decode_ns = bytes if ns_serializer is None else ns_serializer.deserialize
            try:
                timer = (int(ts), key(raw_key), decode_ns(raw_ns))
            except UNREADABLE as exc:
                raise CorruptCheckpointError(
                    f"timer queue {name!r}, key group {kg}: a checkpointed timer cannot be read "
                    f"({type(exc).__name__}: {exc})"
                ) from None
            current[timer] = None

    def install(self) -> int:
        """Put every collected timer into its queue; returns how many were restored."""
        n = 0
        for state, per_kg in self._timers.values():
            for index, timers in enumerate(per_kg):
                for ts, key, ns in timers or ():
                    state.queue.add(ts, key, ns, index)
                    n += 1
        self._timers.clear()
        return n

    def abort(self) -> None:
        """The restore failed: drop the queues it created (the program's queues stay empty)."""
        for name in self._created:
            self.queues.discard(name)
        self._timers.clear()
