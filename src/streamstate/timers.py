"""Timers: key-group partitioned priority queues with set semantics (SPEC §9).

A timer is ``(timestamp, key, namespace)``; registering the same timer twice keeps one. Timers are
keyed state: each key group has its own set, so timers are snapshotted with their key group and
follow it on rescale. Firing pops timers in timestamp order from one heap over all key groups and
makes the timer's key the backend's current key before calling the target.

>>> q = KeyGroupedTimerQueue(num_key_groups=2)
>>> q.add(20, "b", None, 1), q.add(10, "a", None, 0), q.add(10, "a", None, 0)
(True, True, False)
>>> q.poll(), q.poll(), q.poll()
((10, 'a', None, 0), (20, 'b', None, 1), None)

Complexity: ``add``/``remove`` O(log n) amortized (removal is lazy: the heap entry is skipped
when it surfaces), ``peek``/``poll`` amortized O(log n).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from streamstate.api.functions import TimerService
from streamstate.backends.snapshot import (
    TIMER_STATE_KIND,
    DeltaEntries,
    SnapshotSource,
    StateMetaInfo,
)
from streamstate.errors import KeyGroupOutOfRangeError, NoCurrentKeyError, StateAccessError
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers import Int64Serializer, TypeSerializer, VoidNamespaceSerializer

__all__ = [
    "MIN_WATERMARK",
    "InternalTimer",
    "InternalTimerService",
    "KeyGroupedTimerQueue",
    "Triggerable",
    "UserTimerService",
]

MIN_WATERMARK = -(1 << 63)
"""The watermark before any event time has been seen (Java's Long.MIN_VALUE)."""

InternalTimer = tuple[int, Any, Any]
"""``(timestamp, key, namespace)``."""


class KeyGroupedTimerQueue:
    """A priority queue of timers with set semantics, partitioned by key group.

    Timers with equal timestamps come out in the order they were added.
    """

    __slots__ = ("_by_kg", "_heap", "_seq", "_size", "changed")

    #: compact the heap once it holds this many more entries than twice the live timers
    COMPACT_SLACK = 64

    def __init__(self, num_key_groups: int) -> None:
        # per key group: (timestamp, key, namespace) -> sequence number of its live heap entry
        self._by_kg: list[dict[tuple[int, Any, Any], int]] = [{} for _ in range(num_key_groups)]
        self._heap: list[tuple[int, int, int, Any, Any]] = []
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
        heapq.heappush(self._heap, (timestamp, seq, kg_index, key, namespace))
        self.changed.add(kg_index)
        return True

    def remove(self, timestamp: int, key: Any, namespace: Any, kg_index: int) -> bool:
        """Remove a timer; False if it was not there.

        The heap entry is dropped lazily (when it surfaces, or by a compaction once removed
        entries outnumber live ones), so removal is O(1) amortized.
        """
        if self._by_kg[kg_index].pop((timestamp, key, namespace), None) is None:
            return False
        self._size -= 1
        self.changed.add(kg_index)
        if len(self._heap) > 2 * self._size + self.COMPACT_SLACK:
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

    def _drop_stale(self) -> None:
        heap = self._heap
        by_kg = self._by_kg
        while heap:
            ts, seq, kgi, key, ns = heap[0]
            if by_kg[kgi].get((ts, key, ns)) == seq:
                return
            heapq.heappop(heap)

    def peek_timestamp(self) -> int | None:
        """The smallest timestamp of any timer, or None."""
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def poll(self) -> tuple[int, Any, Any, int] | None:
        """Remove and return ``(timestamp, key, namespace, kg_index)`` of the earliest timer."""
        self._drop_stale()
        if not self._heap:
            return None
        ts, _, kgi, key, ns = heapq.heappop(self._heap)
        del self._by_kg[kgi][(ts, key, ns)]
        self._size -= 1
        self.changed.add(kgi)
        return ts, key, ns, kgi

    def __len__(self) -> int:
        return self._size

    def heap_size(self) -> int:
        """Entries in the heap, removed timers not yet dropped included (for tests)."""
        return len(self._heap)

    def timers_of_key_group(self, kg_index: int) -> list[tuple[int, Any, Any]]:
        """``(timestamp, key, namespace)`` of one key group, in the order they were added."""
        return list(self._by_kg[kg_index])

    def __iter__(self) -> Iterator[tuple[int, Any, Any, int]]:
        for kgi, timers in enumerate(self._by_kg):
            for ts, key, ns in timers:
                yield ts, key, ns, kgi

    def compact(self) -> None:
        """Drop heap entries of removed timers (bounds memory after many deletions)."""
        live = [
            (ts, seq, kgi, k, ns)
            for kgi, t in enumerate(self._by_kg)
            for (ts, k, ns), seq in t.items()
        ]
        heapq.heapify(live)
        self._heap = live


class Triggerable(Protocol):
    """What a timer service calls when a timer fires (the current key is already set)."""

    def on_event_time(self, timestamp: int, key: Any, namespace: Any) -> None: ...

    def on_processing_time(self, timestamp: int, key: Any, namespace: Any) -> None: ...


class _KeyContextBackend(Protocol):
    ctx: Any
    key_group_range: Any

    def set_current_key(self, key: Any, key_group: int | None = None) -> None: ...


class _TimerSnapshotSource(SnapshotSource):
    """Timers of one queue as a keyed-snapshot source: entries ``(key, namespace, timestamp)``."""

    def __init__(self, meta: StateMetaInfo, per_kg: list[Any]) -> None:
        self.meta = meta
        #: per key group: [(timestamp, key, namespace)] (full) or DeltaEntries (delta)
        self._per_kg: list[Any] = list(per_kg)

    def entries(self, key_group_index: int) -> Iterable[tuple[Any, Any, Any]] | DeltaEntries | None:
        timers = self._per_kg[key_group_index]
        if not timers or isinstance(timers, DeltaEntries):
            return timers  # type: ignore[no-any-return]
        return [(key, ns, ts) for ts, key, ns in timers]

    def release_key_group(self, key_group_index: int) -> None:
        self._per_kg[key_group_index] = None

    def release(self) -> None:
        self._per_kg = [None] * len(self._per_kg)


class InternalTimerService:
    """Event-time and processing-time timers of one operator, for the backend's current key.

    The service is a participant of the backend's keyed snapshots (``snapshot_source``) and
    is restored key group by key group (``restore_timer``).
    """

    def __init__(
        self,
        name: str,
        backend: _KeyContextBackend,
        triggerable: Triggerable,
        namespace_serializer: TypeSerializer[Any] | None = None,
        key_serializer: TypeSerializer[Any] | None = None,
        processing_time: Callable[[], int] | None = None,
    ) -> None:
        self.name = name
        self.backend = backend
        self.triggerable = triggerable
        self.namespace_serializer = namespace_serializer or VoidNamespaceSerializer()
        n = len(backend.key_group_range)
        self.event_time_timers = KeyGroupedTimerQueue(n)
        self.processing_time_timers = KeyGroupedTimerQueue(n)
        self.current_watermark = MIN_WATERMARK
        self._processing_time = processing_time
        self._manual_processing_time: int | None = None

    # ---- clocks --------------------------------------------------------------------------------

    def current_processing_time(self) -> int:
        if self._manual_processing_time is not None:
            return self._manual_processing_time
        if self._processing_time is not None:
            return self._processing_time()
        import time

        return time.time_ns() // 1_000_000

    # ---- registration (current key) ------------------------------------------------------------

    def register_event_time_timer(self, namespace: Any, timestamp: int) -> None:
        """A timer firing once the watermark reaches ``timestamp`` (set semantics: registering
        the same ``(timestamp, key, namespace)`` twice keeps one timer)."""
        ctx = self.backend.ctx
        self._check(ctx, namespace)
        self.event_time_timers.add(int(timestamp), ctx.key, namespace, ctx.kg_index)

    def delete_event_time_timer(self, namespace: Any, timestamp: int) -> None:
        ctx = self.backend.ctx
        self._check(ctx, namespace)
        self.event_time_timers.remove(int(timestamp), ctx.key, namespace, ctx.kg_index)

    def register_processing_time_timer(self, namespace: Any, timestamp: int) -> None:
        ctx = self.backend.ctx
        self._check(ctx, namespace)
        self.processing_time_timers.add(int(timestamp), ctx.key, namespace, ctx.kg_index)

    def delete_processing_time_timer(self, namespace: Any, timestamp: int) -> None:
        ctx = self.backend.ctx
        self._check(ctx, namespace)
        self.processing_time_timers.remove(int(timestamp), ctx.key, namespace, ctx.kg_index)

    def _check(self, ctx: Any, namespace: Any) -> None:
        if ctx.key is None:
            raise NoCurrentKeyError(
                f"timer service {self.name!r}: timers can only be registered or deleted while a "
                "current key is set"
            )
        if namespace is None:
            raise StateAccessError(
                f"timer service {self.name!r}: a timer's namespace must not be None "
                "(use VOID_NAMESPACE)"
            )

    # ---- firing --------------------------------------------------------------------------------

    def advance_watermark(self, watermark: int) -> int:
        """Fire every event-time timer with ``timestamp <= watermark`` in timestamp order;
        returns how many fired.

        The watermark never goes back: a lower ``watermark`` leaves it as it is (and fires only
        timers registered meanwhile at or below it). Timers registered while firing that are
        already due fire in the same call.
        """
        self.current_watermark = max(self.current_watermark, int(watermark))
        return self._fire(
            self.event_time_timers, self.current_watermark, self.triggerable.on_event_time
        )

    def advance_processing_time(self, time: int) -> int:
        """Set processing time (manual clock, never going back) and fire due processing-time
        timers."""
        now = int(time)
        if self._manual_processing_time is not None and now < self._manual_processing_time:
            now = self._manual_processing_time
        self._manual_processing_time = now
        return self._fire(self.processing_time_timers, now, self.triggerable.on_processing_time)

    def fire_due_processing_time_timers(self) -> int:
        """Fire processing-time timers that are due by the current processing time."""
        return self._fire(
            self.processing_time_timers,
            self.current_processing_time(),
            self.triggerable.on_processing_time,
        )

    def _fire(
        self, queue: KeyGroupedTimerQueue, until: int, target: Callable[[int, Any, Any], None]
    ) -> int:
        fired = 0
        start = self.backend.key_group_range.start
        while True:
            ts = queue.peek_timestamp()
            if ts is None or ts > until:
                return fired
            polled = queue.poll()
            assert polled is not None
            ts, key, ns, kgi = polled
            self.backend.set_current_key(key, kgi + start)
            target(ts, key, ns)
            fired += 1

    def num_event_time_timers(self) -> int:
        return len(self.event_time_timers)

    def num_processing_time_timers(self) -> int:
        return len(self.processing_time_timers)

    # ---- snapshot / restore --------------------------------------------------------------------

    def state_name(self, domain: str) -> str:
        return f"_timers.{self.name}.{domain}"

    def snapshot_sources(self) -> list[SnapshotSource]:
        """Synchronous copy of both queues, as keyed-snapshot sources (one per domain)."""
        out: list[SnapshotSource] = []
        for domain, queue in (
            ("event", self.event_time_timers),
            ("processing", self.processing_time_timers),
        ):
            meta = StateMetaInfo(
                self.state_name(domain),
                TIMER_STATE_KIND,
                self.namespace_serializer,
                Int64Serializer(),
            )
            per_kg = [
                queue.timers_of_key_group(i) for i in range(len(self.backend.key_group_range))
            ]
            out.append(_TimerSnapshotSource(meta, per_kg))
        return out

    def delta_snapshot_sources(self) -> list[SnapshotSource]:
        """The timers of the key groups whose timers changed since the last delta, each key
        group's complete set replacing the previous one (incremental checkpoints)."""
        out: list[SnapshotSource] = []
        n = len(self.backend.key_group_range)
        for domain, queue in (
            ("event", self.event_time_timers),
            ("processing", self.processing_time_timers),
        ):
            meta = StateMetaInfo(
                self.state_name(domain),
                TIMER_STATE_KIND,
                self.namespace_serializer,
                Int64Serializer(),
            )
            per_kg: list[Any] = [None] * n
            for kgi in queue.take_changed():
                timers = queue.timers_of_key_group(kgi)
                per_kg[kgi] = DeltaEntries([(key, ns, ts) for ts, key, ns in timers], None)
            out.append(_TimerSnapshotSource(meta, per_kg))
        return out

    def reset_changes(self) -> None:
        """Forget which key groups changed (a full snapshot became the new base)."""
        self.event_time_timers.take_changed()
        self.processing_time_timers.take_changed()

    def restore_timer(
        self, domain: str, key: Any, namespace: Any, timestamp: int, key_group: int
    ) -> None:
        """Re-register one checkpointed timer (its key group must be in this backend's range).

        ``domain`` is ``"event"`` or ``"processing"`` (the suffix of :meth:`state_name`).
        """
        if domain == "event":
            queue = self.event_time_timers
        elif domain == "processing":
            queue = self.processing_time_timers
        else:
            raise ValueError(
                f"timer service {self.name!r}: unknown timer domain {domain!r}; "
                "expected 'event' or 'processing'"
            )
        kg_range = self.backend.key_group_range
        if not kg_range.contains(key_group):
            raise KeyGroupOutOfRangeError(
                f"timer service {self.name!r}: a checkpointed timer of key {key!r} belongs to key "
                f"group {key_group}, outside this backend's range {kg_range}"
            )
        queue.add(int(timestamp), key, namespace, key_group - kg_range.start)


class UserTimerService(TimerService):
    """The :class:`TimerService` a ``KeyedProcessFunction`` sees: timers in the void namespace."""

    __slots__ = ("_internal",)

    def __init__(self, internal: InternalTimerService) -> None:
        self._internal = internal

    def current_processing_time(self) -> int:
        return self._internal.current_processing_time()

    def current_watermark(self) -> int:
        return self._internal.current_watermark

    def register_event_time_timer(self, timestamp: int) -> None:
        self._internal.register_event_time_timer(VOID_NAMESPACE, timestamp)

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._internal.register_processing_time_timer(VOID_NAMESPACE, timestamp)

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._internal.delete_event_time_timer(VOID_NAMESPACE, timestamp)

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._internal.delete_processing_time_timer(VOID_NAMESPACE, timestamp)
