"""Triggers: when a window's contents are emitted (SPEC §9). Names follow PyFlink.

A trigger reacts to elements and timers of one window at a time. Its timers and its state live
in the window's namespace (``ctx.register_event_time_timer``, ``ctx.get_partitioned_state``), so
``clear`` must delete what it registered: the window operator calls it when the window is
cleaned up.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from datetime import timedelta
from typing import Any

from streamstate.api.descriptors import (
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from streamstate.windows.evictors import delta_function

__all__ = [
    "ContinuousEventTimeTrigger",
    "ContinuousProcessingTimeTrigger",
    "CountTrigger",
    "DeltaTrigger",
    "EndOfStreamTrigger",
    "EventTimeTrigger",
    "NeverTrigger",
    "OnMergeContext",
    "ProcessingTimeTrigger",
    "PurgingTrigger",
    "Trigger",
    "TriggerContext",
    "TriggerResult",
]


class TriggerResult(enum.Enum):
    """What to do with a window: emit it (fire) and/or drop its contents (purge)."""

    CONTINUE = (False, False)
    FIRE_AND_PURGE = (True, True)
    FIRE = (True, False)
    PURGE = (False, True)

    def is_fire(self) -> bool:
        """Whether the window function runs."""
        return self.value[0]

    def is_purge(self) -> bool:
        """Whether the window's contents are cleared."""
        return self.value[1]


class TriggerContext(ABC):
    """What a trigger sees: clocks, timers and state in the current window's namespace."""

    @abstractmethod
    def get_current_processing_time(self) -> int:
        """The current processing time (ms)."""

    @abstractmethod
    def get_metric_group(self) -> Any:
        """The operator's metric group."""

    @abstractmethod
    def get_current_watermark(self) -> int:
        """The current watermark (ms)."""

    @abstractmethod
    def register_processing_time_timer(self, time: int) -> None:
        """Call ``on_processing_time`` for this key and window at ``time``."""

    @abstractmethod
    def register_event_time_timer(self, time: int) -> None:
        """Call ``on_event_time`` for this key and window when the watermark reaches ``time``."""

    @abstractmethod
    def delete_processing_time_timer(self, time: int) -> None:
        """Delete this key's and window's processing-time timer at ``time``."""

    @abstractmethod
    def delete_event_time_timer(self, time: int) -> None:
        """Delete this key's and window's event-time timer at ``time``."""

    @abstractmethod
    def get_partitioned_state(self, state_descriptor: StateDescriptor) -> Any:
        """A keyed state of the current key scoped to the current window."""


class OnMergeContext(TriggerContext):
    """The context of :meth:`~streamstate.windows.triggers.Trigger.on_merge`."""

    @abstractmethod
    def merge_partitioned_state(self, state_descriptor: StateDescriptor) -> None:
        """Merge the state of the merged windows into the merge result's namespace."""


class Trigger(ABC):
    """Decides when a window fires and is purged."""

    @abstractmethod
    def on_element(
        self, element: Any, timestamp: int | None, window: Any, ctx: TriggerContext
    ) -> TriggerResult:
        """Called for every element added to ``window``: fire, purge, both or continue."""

    @abstractmethod
    def on_processing_time(self, time: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        """Called when a processing-time timer this trigger registered for ``window`` fires."""

    @abstractmethod
    def on_event_time(self, time: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        """Called when an event-time timer this trigger registered for ``window`` fires."""

    def can_merge(self) -> bool:
        """Whether the trigger supports merging windows (sessions)."""
        return False

    def on_merge(self, window: Any, ctx: OnMergeContext) -> None:
        """Windows were merged into ``window`` (sessions): re-register the merged windows'
        timers for it (only triggers whose :meth:`can_merge` is true)."""
        raise NotImplementedError(f"{type(self).__name__} does not support merging windows")

    @abstractmethod
    def clear(self, window: Any, ctx: TriggerContext) -> None:
        """Delete every timer and state this trigger keeps for ``window``."""

    def state_descriptors(self) -> list[StateDescriptor]:
        """The states this trigger keeps per window (``ctx.get_partitioned_state``): the window
        operator declares them when it opens, so that a restore checks them before any element
        and does not report them as undeclared."""
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class EventTimeTrigger(Trigger):
    """Fires once the watermark passes the window's end (and at once for late elements that
    are still within the allowed lateness)."""

    @classmethod
    def create(cls) -> EventTimeTrigger:
        """The trigger (fires when the watermark passes the window's end)."""
        return cls()

    def on_element(
        self, element: Any, timestamp: int | None, window: Any, ctx: TriggerContext
    ) -> TriggerResult:
        if window.max_timestamp() <= ctx.get_current_watermark():
            return TriggerResult.FIRE  # late but within the allowed lateness: fire again now
        ctx.register_event_time_timer(window.max_timestamp())
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.FIRE if time == window.max_timestamp() else TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Any, ctx: OnMergeContext) -> None:
        if window.max_timestamp() > ctx.get_current_watermark():
            ctx.register_event_time_timer(window.max_timestamp())

    def clear(self, window: Any, ctx: TriggerContext) -> None:
        ctx.delete_event_time_timer(window.max_timestamp())


class ProcessingTimeTrigger(Trigger):
    """Fires once processing time passes the window's end."""

    @classmethod
    def create(cls) -> ProcessingTimeTrigger:
        """The trigger (fires when processing time passes the window's end)."""
        return cls()

    def on_element(
        self, element: Any, timestamp: int | None, window: Any, ctx: TriggerContext
    ) -> TriggerResult:
        ctx.register_processing_time_timer(window.max_timestamp())
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.FIRE

    def on_event_time(self, time: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Any, ctx: OnMergeContext) -> None:
        if window.max_timestamp() > ctx.get_current_processing_time():
            ctx.register_processing_time_timer(window.max_timestamp())

    def clear(self, window: Any, ctx: TriggerContext) -> None:
        ctx.delete_processing_time_timer(window.max_timestamp())


def _sum(a: int, b: int) -> int:
    return a + b


class CountTrigger(Trigger):
    """Fires every ``count`` elements; the running count is state in the window's namespace."""

    def __init__(self, count: int) -> None:
        if count < 1:
            raise ValueError(f"CountTrigger needs a count >= 1, got {count}")
        self.count = count
        self.state_descriptor = ReducingStateDescriptor("trigger-count", _sum, int)

    def state_descriptors(self) -> list[StateDescriptor]:
        return [self.state_descriptor]

    @classmethod
    def of(cls, count: int) -> CountTrigger:
        """Fires every ``count`` elements of a window."""
        return cls(count)

    def on_element(
        self, element: Any, timestamp: int | None, window: Any, ctx: TriggerContext
    ) -> TriggerResult:
        count = ctx.get_partitioned_state(self.state_descriptor)
        count.add(1)
        if count.get() >= self.count:
            count.clear()
            return TriggerResult.FIRE
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Any, ctx: OnMergeContext) -> None:
        ctx.merge_partitioned_state(self.state_descriptor)

    def clear(self, window: Any, ctx: TriggerContext) -> None:
        ctx.get_partitioned_state(self.state_descriptor).clear()

    def __repr__(self) -> str:
        return f"CountTrigger({self.count})"


class PurgingTrigger(Trigger):
    """Turns every FIRE of the wrapped trigger into FIRE_AND_PURGE."""

    def __init__(self, nested: Trigger) -> None:
        self.nested = nested

    @classmethod
    def of(cls, nested: Trigger) -> PurgingTrigger:
        """``nested``, with every FIRE turned into FIRE_AND_PURGE."""
        return cls(nested)

    @staticmethod
    def _purging(result: TriggerResult) -> TriggerResult:
        return TriggerResult.FIRE_AND_PURGE if result.is_fire() else result

    def on_element(
        self, element: Any, timestamp: int | None, window: Any, ctx: TriggerContext
    ) -> TriggerResult:
        return self._purging(self.nested.on_element(element, timestamp, window, ctx))

    def on_processing_time(self, time: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return self._purging(self.nested.on_processing_time(time, window, ctx))

    def on_event_time(self, time: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return self._purging(self.nested.on_event_time(time, window, ctx))

    def can_merge(self) -> bool:
        return self.nested.can_merge()

    def on_merge(self, window: Any, ctx: OnMergeContext) -> None:
        self.nested.on_merge(window, ctx)

    def clear(self, window: Any, ctx: TriggerContext) -> None:
        self.nested.clear(window, ctx)

    def state_descriptors(self) -> list[StateDescriptor]:
        return self.nested.state_descriptors()

    def __repr__(self) -> str:
        return f"PurgingTrigger({self.nested!r})"


class NeverTrigger(Trigger):
    """Never fires (the default of ``GlobalWindows.create()``); as Flink's, it does not support
    merging windows."""

    def on_element(
        self, element: Any, timestamp: int | None, window: Any, ctx: TriggerContext
    ) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def clear(self, window: Any, ctx: TriggerContext) -> None:
        return None


class EndOfStreamTrigger(Trigger):
    """Fires once, when the input ends (the default of
    ``GlobalWindows.create_with_end_of_stream_trigger()``, Flink's
    ``GlobalWindows.EndOfStreamTrigger``).

    Every element registers an event-time timer at the window's ``max_timestamp`` (the end of
    time for a ``GlobalWindow``), which only the final watermark of a bounded input reaches: the
    end of ``LocalRunner.run`` and of a Spark batch-mode job. A streaming query that never ends
    never fires it. It keeps no state; it does not support merging windows."""

    def on_element(
        self, element: Any, timestamp: int | None, window: Any, ctx: TriggerContext
    ) -> TriggerResult:
        ctx.register_event_time_timer(window.max_timestamp())
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.FIRE if time == window.max_timestamp() else TriggerResult.CONTINUE

    def clear(self, window: Any, ctx: TriggerContext) -> None:
        return None  # as Flink's: its one timer is at the end of input


def _min(a: int, b: int) -> int:
    return a if a <= b else b


def _java_rem(a: int, b: int) -> int:
    """``a % b`` as Java computes it (the sign of ``a``): Flink aligns fire times with it, so a
    negative timestamp rounds towards zero."""
    r = abs(a) % b
    return r if a >= 0 else -r


def _interval(interval: Any, who: str) -> int:
    if isinstance(interval, timedelta):
        interval = int(interval.total_seconds() * 1000)
    if isinstance(interval, bool) or not isinstance(interval, int) or interval <= 0:
        raise ValueError(f"{who} needs an interval > 0 ms, got {interval!r}")
    return interval


class _ContinuousTrigger(Trigger):
    """What the continuous triggers share: a pending fire time kept in the reducing state
    ``fire-time`` (min, so merged sessions keep the earliest), the next one ``interval`` later
    and capped at the window's ``max_timestamp``; they differ in the time domain of their
    timers."""

    def __init__(self, interval: int) -> None:
        self.interval = _interval(interval, type(self).__name__)
        self.state_descriptor = ReducingStateDescriptor("fire-time", _min, int)

    def state_descriptors(self) -> list[StateDescriptor]:
        return [self.state_descriptor]

    @classmethod
    def of(cls, interval: Any) -> Any:
        return cls(_interval(interval, cls.__name__))

    def _register_timer(self, ctx: TriggerContext, time: int) -> None:
        raise NotImplementedError

    def _delete_timer(self, ctx: TriggerContext, time: int) -> None:
        raise NotImplementedError

    def _register_next(self, time: int, window: Any, ctx: TriggerContext, state: Any) -> None:
        next_fire = min(time + self.interval, window.max_timestamp())
        state.add(next_fire)
        self._register_timer(ctx, next_fire)

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Any, ctx: OnMergeContext) -> None:
        ctx.merge_partitioned_state(self.state_descriptor)
        next_fire = ctx.get_partitioned_state(self.state_descriptor).get()
        if next_fire is not None:
            self._register_timer(ctx, next_fire)

    def clear(self, window: Any, ctx: TriggerContext) -> None:
        state = ctx.get_partitioned_state(self.state_descriptor)
        fire_time = state.get()
        if fire_time is not None:
            self._delete_timer(ctx, fire_time)
            state.clear()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.interval})"


class ContinuousEventTimeTrigger(_ContinuousTrigger):
    """Fires every ``interval`` ms of event time while the window is open, and when the
    watermark passes the window's end (as Flink 2.3).

    The first fire time is ``timestamp - timestamp % interval + interval`` (Java's remainder)
    for the window's first element, then every ``interval``, capped at the window's
    ``max_timestamp``; the pending fire time is the reducing state ``fire-time`` (min), so
    merged sessions keep the earliest."""

    def _register_timer(self, ctx: TriggerContext, time: int) -> None:
        ctx.register_event_time_timer(time)

    def _delete_timer(self, ctx: TriggerContext, time: int) -> None:
        ctx.delete_event_time_timer(time)

    def on_element(
        self, element: Any, timestamp: int | None, window: Any, ctx: TriggerContext
    ) -> TriggerResult:
        if window.max_timestamp() <= ctx.get_current_watermark():
            return TriggerResult.FIRE  # the watermark is past the window already
        ctx.register_event_time_timer(window.max_timestamp())
        state = ctx.get_partitioned_state(self.state_descriptor)
        if state.get() is None:
            if timestamp is None:
                raise ValueError(
                    "ContinuousEventTimeTrigger needs event timestamps: give the runner a "
                    "timestamp_assigner"
                )
            self._register_next(timestamp - _java_rem(timestamp, self.interval), window, ctx, state)
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        if time == window.max_timestamp():
            return TriggerResult.FIRE
        state = ctx.get_partitioned_state(self.state_descriptor)
        if state.get() == time:
            state.clear()
            self._register_next(time, window, ctx, state)
            return TriggerResult.FIRE
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE


class ContinuousProcessingTimeTrigger(_ContinuousTrigger):
    """Fires every ``interval`` ms of processing time (as Flink 2.3): the first fire time is
    aligned on the processing time of the window's first element
    (``now - now % interval + interval``), later ones follow every ``interval``, capped at the
    window's ``max_timestamp``; the pending fire time is the reducing state ``fire-time`` (min).

    A processing-time timer at the window's ``max_timestamp`` fires the window and leaves the
    fire time as it is, so no timer follows it. An event-time window that processing time has
    already passed therefore fires once, at its first element's timer, and not for the elements
    after it (they find a fire time set); the watermark then cleans it up."""

    def _register_timer(self, ctx: TriggerContext, time: int) -> None:
        ctx.register_processing_time_timer(time)

    def _delete_timer(self, ctx: TriggerContext, time: int) -> None:
        ctx.delete_processing_time_timer(time)

    def on_element(
        self, element: Any, timestamp: int | None, window: Any, ctx: TriggerContext
    ) -> TriggerResult:
        state = ctx.get_partitioned_state(self.state_descriptor)
        if state.get() is None:
            now = ctx.get_current_processing_time()
            self._register_next(now - _java_rem(now, self.interval), window, ctx, state)
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        if time == window.max_timestamp():
            return TriggerResult.FIRE
        state = ctx.get_partitioned_state(self.state_descriptor)
        if state.get() == time:
            state.clear()
            self._register_next(time, window, ctx, state)
            return TriggerResult.FIRE
        return TriggerResult.CONTINUE


class DeltaTrigger(Trigger):
    """Fires when ``delta_function(last_fired_element, element) > threshold``; the element it
    compares with is kept in the value state ``last-element`` (typed by ``state_serializer``), set
    by the window's first element and by every firing element (as Flink). It does not support
    merging windows."""

    def __init__(self, threshold: float, delta_fn: Any, state_serializer: Any) -> None:
        if state_serializer is None:
            raise ValueError(
                "DeltaTrigger needs the type (or serializer) of the elements it keeps in its "
                "'last-element' state"
            )
        self.threshold = threshold
        self.delta_function = delta_function(delta_fn)
        self.state_descriptor = ValueStateDescriptor("last-element", state_serializer)

    def state_descriptors(self) -> list[StateDescriptor]:
        return [self.state_descriptor]

    @classmethod
    def of(cls, threshold: float, delta_fn: Any, state_serializer: Any) -> DeltaTrigger:
        """Fires when ``delta_fn(last, element) > threshold``; ``state_serializer`` types the kept
        last element."""
        return cls(threshold, delta_fn, state_serializer)

    def on_element(
        self, element: Any, timestamp: int | None, window: Any, ctx: TriggerContext
    ) -> TriggerResult:
        last = ctx.get_partitioned_state(self.state_descriptor)
        previous = last.value()
        if previous is None:
            last.update(element)
            return TriggerResult.CONTINUE
        if self.delta_function(previous, element) > self.threshold:
            last.update(element)
            return TriggerResult.FIRE
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def clear(self, window: Any, ctx: TriggerContext) -> None:
        ctx.get_partitioned_state(self.state_descriptor).clear()

    def __repr__(self) -> str:
        return f"DeltaTrigger({self.threshold!r}, {self.delta_function!r})"
