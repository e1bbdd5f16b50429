"""Timers: key-group partitioned priority queues with set semantics (SPEC §9).

A timer is ``(timestamp, key, namespace)``; registering the same timer twice keeps one. Timers are
keyed state: each key group has its own set, so timers are snapshotted with their key group and
follow it on rescale. Firing pops timers in timestamp order from one heap over all key groups and
makes the timer's key the backend's current key before calling the target.

The queues (:class:`KeyGroupedTimerQueue`, ``backends/timer_queues.py``) belong to the keyed
backend, which creates, snapshots and restores them; a timer service registers, deletes and
fires the timers of its two queues.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from streamstate.api.functions import TimerService
from streamstate.backends.timer_queues import KeyGroupedTimerQueue
from streamstate.errors import NoCurrentKeyError, StateAccessError
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers import TypeSerializer, VoidNamespaceSerializer

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


class Triggerable(Protocol):
    """What a timer service calls when a timer fires (the current key is already set)."""

    def on_event_time(self, timestamp: int, key: Any, namespace: Any) -> None: ...

    def on_processing_time(self, timestamp: int, key: Any, namespace: Any) -> None: ...


class _KeyContextBackend(Protocol):
    """What a timer service needs of its keyed backend (``KeyedStateBackend`` is one)."""

    ctx: Any
    key_group_range: Any

    def set_current_key(self, key: Any, key_group: int | None = None) -> None: ...

    def create_timer_queue(
        self, name: str, namespace_serializer: TypeSerializer[Any]
    ) -> KeyGroupedTimerQueue: ...


class InternalTimerService:
    """Event-time and processing-time timers of one operator, for the backend's current key.

    Its two queues belong to the backend, which creates them (``create_timer_queue``, named by
    :meth:`state_name`), snapshots them with the keyed state and restores them, rescaling
    included: a service created after a restore finds its timers in its queues.
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
        self.event_time_timers = backend.create_timer_queue(
            self.state_name("event"), self.namespace_serializer
        )
        self.processing_time_timers = backend.create_timer_queue(
            self.state_name("processing"), self.namespace_serializer
        )
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
        poll = queue.poll_until
        set_key = self.backend.set_current_key
        while True:
            polled = poll(until)
            if polled is None:
                return fired
            ts, key, ns, kgi = polled
            set_key(key, kgi + start)
            target(ts, key, ns)
            fired += 1

    def earliest_event_time_timer(self) -> int | None:
        """The timestamp of the next event-time timer to fire, or None (amortized O(1))."""
        return self.event_time_timers.peek_timestamp()

    def earliest_processing_time_timer(self) -> int | None:
        """The timestamp of the next processing-time timer to fire, or None."""
        return self.processing_time_timers.peek_timestamp()

    def num_event_time_timers(self) -> int:
        return len(self.event_time_timers)

    def num_processing_time_timers(self) -> int:
        return len(self.processing_time_timers)

    # ---- names -------------------------------------------------------------------------------

    def state_name(self, domain: str) -> str:
        """The pseudo-state name of the timers of ``domain`` ("event" or "processing") in the
        backend's keyed snapshots."""
        return f"_timers.{self.name}.{domain}"


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
