"""The timers of one key (Flink's ``BatchExecutionInternalPriorityQueueSet``).

A :class:`~streamstate.backends.timer_queues.KeyGroupedTimerQueue` that only ever holds timers of
the backend's current key: the batch backend empties it when the key changes, after the timer
service fired what the key registered. Set semantics on ``(timestamp, namespace)``; the key and
key group a timer service passes are those of the current key (the key is kept to be handed
back, the key group ignored). Timers with equal timestamps come out in the order they were
added, as the key's timers do from the streaming queue.

It overrides every operation of the key-grouped queue with a leaner one (no per-key-group sets,
no change tracking for incremental checkpoints): a key registers and fires its timers once per
key, which in a batch run with many small keys is a per-record cost. Most keys register one
timer (an end-of-key timer, a window's end): a queue holding one timer keeps it in a slot of
its own (:attr:`SingleKeyTimerQueue.sole`), without the set and the heap, which a second timer
of the key brings in.

>>> q = SingleKeyTimerQueue()
>>> q.add(20, "k", None, 7), q.add(10, "k", None, 7), q.add(10, "k", None, 7)
(True, True, False)
>>> q.remove(20, "k", None, 7), len(q), q.poll(), q.poll()
(True, 1, (10, 'k', None, 0), None)

Complexity: ``add`` O(log n), ``remove`` O(1) (the heap entry is skipped when it surfaces),
``poll`` amortized O(log n), ``clear`` O(1) when empty; n is the number of timers of one key;
every operation O(1) while the key has one timer.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator
from typing import Any

from streamstate.backends.timer_queues import KeyGroupedTimerQueue

__all__ = ["SingleKeyTimerQueue"]

_heappush = heapq.heappush
_heappop = heapq.heappop


class SingleKeyTimerQueue(KeyGroupedTimerQueue):
    """Timers of the current key: set semantics, timestamp order (see the module docstring)."""

    __slots__ = ("_live", "_pending", "heap", "sole")

    def __init__(self, pending: list[int] | None = None) -> None:
        # the key-grouped queue's structures are not used
        self._by_kg = []
        self.changed = set()
        self._size = 0
        #: (timestamp, namespace) -> sequence number of its live heap entry
        self._live: dict[tuple[int, Any], int] = {}
        #: entries ``(timestamp, sequence number, key, namespace)`` as a heap; emptied in place
        #: when no timer is left, so an empty list means no timer
        self.heap: list[tuple[int, int, Any, Any]] = []
        self._seq = 0  # type: ignore[assignment]
        #: ``(timestamp, key, namespace)`` of the queue's only timer, or None: while it is set,
        #: the set and the heap hold no live timer (a second timer moves it into them)
        self.sole: tuple[int, Any, Any] | None = None
        #: a counter shared by the backend's queues: timers added since the key began (the
        #: backend skips firing a key without any)
        self._pending = pending if pending is not None else [0]

    def add(self, timestamp: int, key: Any, namespace: Any, kg_index: int = 0) -> bool:
        """Add a timer of the current key; False if it was already there."""
        sole = self.sole
        live = self._live
        if sole is None:
            if not live:
                # the key's first timer (the heap holds skipped entries at most)
                if self.heap:
                    self.heap.clear()
                self.sole = (timestamp, key, namespace)
                self._pending[0] += 1
                return True
        elif sole[0] == timestamp and (sole[2] is namespace or sole[2] == namespace):
            return False
        else:
            # a second timer: the first one goes into the set and the heap before it
            self.sole = None
            self._push(sole[0], sole[1], sole[2])
        if (timestamp, namespace) in live:
            return False
        self._push(timestamp, key, namespace)
        self._pending[0] += 1
        return True

    def _push(self, timestamp: int, key: Any, namespace: Any) -> None:
        seq: int = self._seq  # type: ignore[assignment]
        self._seq = seq + 1  # type: ignore[assignment]
        self._live[(timestamp, namespace)] = seq
        _heappush(self.heap, (timestamp, seq, key, namespace))

    def fire_all(self, target: Callable[[int, Any, Any], object]) -> int:
        """Remove every timer in order, calling ``target(timestamp, key, namespace)`` for each;
        a timer removed meanwhile (by an earlier ``target``) is skipped, one added meanwhile is
        fired too. Returns how many fired."""
        heap = self.heap
        live = self._live
        fired = 0
        while True:
            sole = self.sole
            if sole is not None:
                # the common case (one timer per key), and a timer added while others fired
                self.sole = None
                target(sole[0], sole[1], sole[2])
                fired += 1
            elif heap:
                ts, seq, key, ns = _heappop(heap)
                ident = (ts, ns)
                if live.get(ident) == seq:
                    del live[ident]
                    target(ts, key, ns)
                    fired += 1
            else:
                return fired

    def remove(self, timestamp: int, key: Any, namespace: Any, kg_index: int = 0) -> bool:
        """Remove a timer; False if it was not there (its heap entry is skipped later)."""
        sole = self.sole
        if sole is not None:
            if sole[0] == timestamp and (sole[2] is namespace or sole[2] == namespace):
                self.sole = None
                return True
            return False
        live = self._live
        if live.pop((timestamp, namespace), None) is None:
            return False
        if not live:
            self.heap.clear()
        return True

    def contains(self, timestamp: int, key: Any, namespace: Any, kg_index: int = 0) -> bool:
        sole = self.sole
        if sole is not None:
            return sole[0] == timestamp and (sole[2] is namespace or sole[2] == namespace)
        return (timestamp, namespace) in self._live

    def take_changed(self) -> set[int]:
        return set()

    def peek_timestamp(self) -> int | None:
        """The smallest timestamp of any timer, or None."""
        if self.sole is not None:
            return self.sole[0]
        heap = self.heap
        live = self._live
        while heap:
            ts, seq, _, ns = heap[0]
            if live.get((ts, ns)) == seq:
                return ts
            _heappop(heap)
        return None

    def poll(self) -> tuple[int, Any, Any, int] | None:
        """Remove and return ``(timestamp, key, namespace, 0)`` of the earliest timer."""
        return self.poll_until(math.inf)

    def poll_until(self, until: float) -> tuple[int, Any, Any, int] | None:
        """:meth:`poll` if the earliest timer's timestamp is at most ``until``, else None."""
        sole = self.sole
        if sole is not None:
            if sole[0] > until:
                return None
            self.sole = None
            return sole[0], sole[1], sole[2], 0
        heap = self.heap
        live = self._live
        while heap:
            ts, seq, key, ns = heap[0]
            if ts > until:
                return None
            _heappop(heap)
            ident = (ts, ns)
            if live.get(ident) == seq:
                del live[ident]
                return ts, key, ns, 0
        return None

    def clear(self) -> None:
        """Drop every timer (the key changed)."""
        self.sole = None
        if self._live:
            self._live.clear()
        if self.heap:
            self.heap.clear()

    def compact(self) -> None:
        """Nothing to compact: the queue empties at every key change."""

    @property
    def num_key_groups(self) -> int:
        return 1

    def heap_size(self) -> int:
        return len(self.heap) + (self.sole is not None)

    def timers_of_key_group(self, kg_index: int) -> list[tuple[int, Any, Any]]:
        """``(timestamp, key, namespace)`` of the current key, in the order they were added."""
        if self.sole is not None:
            return [self.sole]
        ordered = sorted((seq, ts, key, ns) for ts, seq, key, ns in self.heap)
        return [(ts, key, ns) for seq, ts, key, ns in ordered if self._live.get((ts, ns)) == seq]

    def __iter__(self) -> Iterator[tuple[int, Any, Any, int]]:
        for ts, key, ns in self.timers_of_key_group(0):
            yield ts, key, ns, 0

    def __len__(self) -> int:
        return len(self._live) + (self.sole is not None)

    def __bool__(self) -> bool:
        return self.sole is not None or bool(self._live)
