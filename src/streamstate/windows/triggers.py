"""Triggers: when a window's contents are emitted (SPEC §9). Names follow PyFlink.

A trigger reacts to elements and timers of one window at a time. Its timers and its state live
in the window's namespace (``ctx.register_event_time_timer``, ``ctx.get_partitioned_state``), so
``clear`` must delete what it registered: the window operator calls it when the window is
cleaned up.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from typing import Any

from streamstate.api.descriptors import ReducingStateDescriptor, StateDescriptor

__all__ = [
    "CountTrigger",
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
        return self.value[0]

    def is_purge(self) -> bool:
        return self.value[1]


class TriggerContext(ABC):
    """What a trigger sees: clocks, timers and state in the current window's namespace."""

    @abstractmethod
    def get_current_processing_time(self) -> int: ...

    @abstractmethod
    def get_metric_group(self) -> Any: ...

    @abstractmethod
    def get_current_watermark(self) -> int: ...

    @abstractmethod
    def register_processing_time_timer(self, time: int) -> None: ...

    @abstractmethod
    def register_event_time_timer(self, time: int) -> None: ...

    @abstractmethod
    def delete_processing_time_timer(self, time: int) -> None: ...

    @abstractmethod
    def delete_event_time_timer(self, time: int) -> None: ...

    @abstractmethod
    def get_partitioned_state(self, state_descriptor: StateDescriptor) -> Any:
        """A keyed state of the current key scoped to the current window."""


class OnMergeContext(TriggerContext):
    """The context of :meth:`Trigger.on_merge`."""

    @abstractmethod
    def merge_partitioned_state(self, state_descriptor: StateDescriptor) -> None:
        """Merge the state of the merged windows into the merge result's namespace."""


class Trigger(ABC):
    """Decides when a window fires and is purged."""

    @abstractmethod
    def on_element(
        self, element: Any, timestamp: int | None, window: Any, ctx: TriggerContext
    ) -> TriggerResult: ...

    @abstractmethod
    def on_processing_time(self, time: int, window: Any, ctx: TriggerContext) -> TriggerResult: ...

    @abstractmethod
    def on_event_time(self, time: int, window: Any, ctx: TriggerContext) -> TriggerResult: ...

    def can_merge(self) -> bool:
        """Whether the trigger supports merging windows (sessions)."""
        return False

    def on_merge(self, window: Any, ctx: OnMergeContext) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not support merging windows")

    @abstractmethod
    def clear(self, window: Any, ctx: TriggerContext) -> None:
        """Delete every timer and state this trigger keeps for ``window``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class EventTimeTrigger(Trigger):
    """Fires once the watermark passes the window's end (and at once for late elements that
    are still within the allowed lateness)."""

    @classmethod
    def create(cls) -> EventTimeTrigger:
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

    @classmethod
    def of(cls, count: int) -> CountTrigger:
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

    def __repr__(self) -> str:
        return f"PurgingTrigger({self.nested!r})"


class NeverTrigger(Trigger):
    """Never fires (the default of ``GlobalWindows``)."""

    def on_element(
        self, element: Any, timestamp: int | None, window: Any, ctx: TriggerContext
    ) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Any, ctx: OnMergeContext) -> None:
        return None

    def clear(self, window: Any, ctx: TriggerContext) -> None:
        return None
