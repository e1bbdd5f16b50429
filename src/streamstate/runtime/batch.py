"""Batch execution: a keyed operator over input sorted by key (SPEC §13.3; FLIP-134, FLIP-140).

Flink's BATCH runtime for bounded input, in two parts:

* :class:`BatchKeyedProcessOperator` hosts the function over the batch state backend
  (``backends/batch/``), which keeps one key's state at a time. Records come in *runs* of one key
  (:meth:`~streamstate.runtime.operator.KeyedProcessOperator.process_runs`); a key's run must
  end before the next key's begins, which is what sorting the input by key guarantees.
* :class:`BatchInternalTimerService` (Flink's ``BatchExecutionInternalTimeService``): timers of
  the current key wait until the key ends. Then the watermark is set to the end of time for that
  key, its event-time timers fire in timestamp order (equal timestamps in registration order),
  then its processing-time timers, all of them whatever their timestamps; timers registered while
  they fire are ignored (the service is *quiesced*, so that a timer re-registering itself cannot
  loop forever), and the watermark goes back to its minimum for the next key. Registering is
  never refused otherwise.

What a function sees, against the streaming path over the same bounded input: the watermark is
the minimum while records are processed (no element is ever late, no window closes early) and
the end of time in timers fired at the end; the final results are the streaming path's (the
state of each key is, at its end, what it is at the end of the input there) except where timers
are registered from timer callbacks at the end (ignored here, fired there: a
``ContinuousEventTimeTrigger`` fires its window once at its first interval and once at its end,
not at every interval in between) and for processing-time timers (all fire at their key's end
here, as in Flink's BATCH mode; a streaming run fires only the due ones). No checkpoints are
taken; with a savepoint, each key's final state is spooled as the key ends.

>>> from streamstate import KeyedProcessFunction, ValueStateDescriptor
>>> from streamstate.serializers import StrSerializer
>>> class SumAtEnd(KeyedProcessFunction):
...     def open(self, ctx):
...         self.total = ctx.get_state(ValueStateDescriptor("total", int, default=0))
...     def process_element(self, value, ctx):
...         self.total.update(self.total.value() + value)
...         ctx.timer_service().register_event_time_timer(0)
...     def on_timer(self, timestamp, ctx):
...         yield ctx.get_current_key(), self.total.value()
>>> op = BatchKeyedProcessOperator(SumAtEnd(), StrSerializer())
>>> op.open()
>>> op.process_runs(["a", "b"], [None, None], [3, 1], [1, 2, 3, 10])
>>> op.end_of_input(); op.drain_output()
[('a', 6), ('b', 10)]
"""

from __future__ import annotations

import logging
from typing import Any

from streamstate.api.functions import KeyedProcessFunction
from streamstate.backends.base import Clock
from streamstate.backends.batch import BatchExecutionKeyedStateBackend, BatchExecutionStateBackend
from streamstate.backends.batch.timer_queue import SingleKeyTimerQueue
from streamstate.metrics import MetricGroup
from streamstate.namespace import VOID_NAMESPACE
from streamstate.runtime.operator import KeyedProcessOperator
from streamstate.serializers import TypeSerializer
from streamstate.timers import MIN_WATERMARK, InternalTimerService, UserTimerService

__all__ = [
    "MAX_WATERMARK",
    "BatchInternalTimerService",
    "BatchKeyedProcessOperator",
    "BatchUserTimerService",
]

log = logging.getLogger(__name__)

MAX_WATERMARK = (1 << 63) - 1
"""The end of time (Java's Long.MAX_VALUE): the watermark while a finished key's timers fire."""


class BatchInternalTimerService(InternalTimerService):
    """Timers of one key at a time, fired when the key ends (see the module docstring).

    Its queues are the batch backend's single-key queues; :meth:`end_of_key` is registered
    with the backend (``add_timer_service``), which calls it when a key that registered timers
    ends, before the finished key's state is dropped.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: timers ignored because they were registered while the service was quiesced
        self.ignored_timers = 0
        #: timers fired at the end of their keys
        self.fired_timers = 0
        # bound once: a registration is a per-record cost (a window registers two per record)
        self._key_context = self.backend.ctx
        self._add_event = self.event_time_timers.add
        self._add_processing = self.processing_time_timers.add
        # the queues' firing and the operator's callbacks, bound once: firing is a per-key cost
        events, processing = self.event_time_timers, self.processing_time_timers
        assert isinstance(events, SingleKeyTimerQueue)
        assert isinstance(processing, SingleKeyTimerQueue)
        self._events = events
        self._fire_events = events.fire_all
        self._on_event_time = self.triggerable.on_event_time  # type: ignore[attr-defined]
        # most keys have no processing-time timer: testing the queue's slot and heap (emptied
        # in place) costs no call
        self._processing = processing
        self._processing_heap = processing.heap

    def register_event_time_timer(self, namespace: Any, timestamp: int) -> None:
        if self.current_watermark == MAX_WATERMARK:
            self._ignore("event", timestamp)
            return
        key = self._key_context.key
        if key is None or namespace is None:
            self._check(self._key_context, namespace)
        self._add_event(
            timestamp if timestamp.__class__ is int else int(timestamp), key, namespace, 0
        )

    def register_processing_time_timer(self, namespace: Any, timestamp: int) -> None:
        if self.current_watermark == MAX_WATERMARK:
            self._ignore("processing", timestamp)
            return
        key = self._key_context.key
        if key is None or namespace is None:
            self._check(self._key_context, namespace)
        self._add_processing(
            timestamp if timestamp.__class__ is int else int(timestamp), key, namespace, 0
        )

    def _ignore(self, domain: str, timestamp: int) -> None:
        if not self.ignored_timers:
            log.warning(
                "timer service %r is quiesced while the timers of a finished key fire: the "
                "%s-time timer for %d (and any later one registered while timers fire) is "
                "ignored, as in Flink's BATCH mode",
                self.name,
                domain,
                timestamp,
            )
        self.ignored_timers += 1

    def advance_watermark(self, watermark: int) -> int:
        """Nothing fires: a key's timers fire when the key ends (:meth:`end_of_key`)."""
        return 0

    def advance_processing_time(self, time: int) -> int:
        """Set processing time (never going back); nothing fires before the key ends."""
        now = int(time)
        if self._manual_processing_time is None or now > self._manual_processing_time:
            self._manual_processing_time = now
        return 0

    def fire_due_processing_time_timers(self) -> int:
        return 0

    def end_of_key(self, _key: Any = None) -> None:
        """Fire every timer of the current key: event-time ones in timestamp order, then
        processing-time ones, with the watermark at the end of time (the backend calls it when
        the key ends)."""
        self.current_watermark = MAX_WATERMARK
        try:
            events = self._events
            sole = events.sole
            if sole is not None and not events._live:
                # the key's one event-time timer (the common case): fired without the queue's
                # loop; registrations are ignored while it fires, so nothing else can be due
                events.sole = None
                self._on_event_time(sole[0], sole[1], sole[2])
                fired = 1
            else:
                fired = self._fire_events(self._on_event_time)
            processing = self._processing
            if processing.sole is not None or self._processing_heap:
                fired += processing.fire_all(self.triggerable.on_processing_time)  # type: ignore[attr-defined]
        finally:
            self.current_watermark = MIN_WATERMARK
        self.fired_timers += fired


class BatchUserTimerService(UserTimerService):
    """The :class:`~streamstate.api.functions.TimerService` a function sees in batch
    execution: registrations go straight to the batch service's queues (the same checks as
    :class:`BatchInternalTimerService`, one call less per registration)."""

    __slots__ = ()

    _internal: BatchInternalTimerService

    def register_event_time_timer(self, timestamp: int) -> None:
        internal = self._internal
        if internal.current_watermark == MAX_WATERMARK:
            internal._ignore("event", timestamp)
            return
        key = internal._key_context.key
        if key is None:
            internal._check(internal._key_context, VOID_NAMESPACE)
        internal._add_event(
            timestamp if timestamp.__class__ is int else int(timestamp), key, VOID_NAMESPACE, 0
        )


class BatchKeyedProcessOperator(KeyedProcessOperator):
    """One subtask of a keyed process operator in batch execution (module docstring): feed it
    runs of one key with :meth:`process_runs`, then call :meth:`end_of_input`.

    Parameters:
        function: the ``KeyedProcessFunction`` (windows included).
        key_serializer: the serializer of the keys (key groups and savepoints use it).
        operator_name: names the operator in metrics and savepoints.
        subtask_index: this subtask's index among ``parallelism``.
        parallelism: subtasks of the operator; with ``max_parallelism`` they give this
            subtask's key groups.
        max_parallelism: key groups.
        state_backend: a
            :class:`~streamstate.backends.batch.factory.BatchExecutionStateBackend` (default:
            one without a savepoint); any other backend is refused.
        clock: processing time (default: the wall clock).
        metric_group: where the operator's metrics go.
    """

    keyed_backend: BatchExecutionKeyedStateBackend
    sorted_input = True

    def __init__(
        self,
        function: KeyedProcessFunction[Any, Any],
        key_serializer: TypeSerializer[Any],
        *,
        operator_name: str = "keyed-process",
        subtask_index: int = 0,
        parallelism: int = 1,
        max_parallelism: int = 128,
        state_backend: BatchExecutionStateBackend | None = None,
        clock: Clock | None = None,
        metric_group: MetricGroup | None = None,
    ) -> None:
        backend = state_backend if state_backend is not None else BatchExecutionStateBackend()
        if not isinstance(backend, BatchExecutionStateBackend):
            raise TypeError(
                "batch execution keeps one key's state at a time in its own backend; "
                f"state_backend must be a BatchExecutionStateBackend, got {backend!r}"
            )
        super().__init__(
            function,
            key_serializer,
            operator_name=operator_name,
            subtask_index=subtask_index,
            parallelism=parallelism,
            max_parallelism=max_parallelism,
            state_backend=backend,
            clock=clock,
            metric_group=metric_group,
        )
        self._ctx._timer_service = BatchUserTimerService(self.timer_service)

    def _create_timer_service(
        self, name: str, namespace_serializer: TypeSerializer[Any], triggerable: Any
    ) -> InternalTimerService:
        service = BatchInternalTimerService(
            name,
            self.keyed_backend,
            triggerable,
            namespace_serializer,
            processing_time=self.clock.now,
        )
        # Flink's BatchExecutionInternalTimeServiceManager: called by the backend when a key
        # ends, before the finished key's state is dropped
        self.keyed_backend.add_timer_service(
            service.end_of_key, (service.event_time_timers, service.processing_time_timers)
        )
        return service

    def advance_watermark(self, watermark: int) -> int:
        """Only the end of time matters (the end of the input): the last key ends."""
        if watermark >= MAX_WATERMARK:
            before = self.num_timers()
            self.end_of_input()
            return before
        return 0

    def end_of_input(self) -> None:
        """The input ended: the last key's timers fire, its state is spooled and dropped."""
        self.keyed_backend.end_of_input()

    @property
    def ignored_timers(self) -> int:
        """Timers ignored because they were registered while a finished key's timers fired."""
        return sum(
            s.ignored_timers
            for s in self.timer_services.values()
            if isinstance(s, BatchInternalTimerService)
        )
