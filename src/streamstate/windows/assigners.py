"""Window assigners: which windows an element belongs to (SPEC §9). Names follow PyFlink.

Sizes, slides, offsets and gaps are milliseconds (an ``int``, ``Time.hours(1)`` or a
``timedelta``).

>>> TumblingEventTimeWindows.of(10).assign_windows("x", 23, None)
[TimeWindow(start=20, end=30)]
>>> SlidingEventTimeWindows.of(10, 5).assign_windows("x", 23, None)
[TimeWindow(start=20, end=30), TimeWindow(start=15, end=25)]
>>> EventTimeSessionWindows.with_gap(5).assign_windows("x", 23, None)
[TimeWindow(start=23, end=28)]
"""

from __future__ import annotations

import enum
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any, Self

from streamstate.serializers.base import TypeSerializer
from streamstate.serializers.window_namespaces import (
    GlobalWindow,
    GlobalWindowSerializer,
    TimeWindow,
    TimeWindowSerializer,
    merge_time_windows,
)
from streamstate.windows.triggers import (
    EndOfStreamTrigger,
    EventTimeTrigger,
    NeverTrigger,
    ProcessingTimeTrigger,
    Trigger,
)

__all__ = [
    "DynamicEventTimeSessionWindows",
    "DynamicProcessingTimeSessionWindows",
    "EventTimeSessionWindows",
    "GlobalWindows",
    "MergingWindowAssigner",
    "ProcessingTimeSessionWindows",
    "SlidingEventTimeWindows",
    "SlidingProcessingTimeWindows",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "WindowAssigner",
    "WindowAssignerContext",
    "WindowStagger",
]


def _millis(value: int | float | timedelta, what: str) -> int:
    if isinstance(value, timedelta):
        return int(value.total_seconds() * 1000)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be milliseconds (int) or a timedelta, got {value!r}")
    return int(value)


class WindowAssignerContext(ABC):
    """What an assigner may ask while assigning."""

    @abstractmethod
    def get_current_processing_time(self) -> int: ...


class WindowAssigner(ABC):
    """Assigns each element to zero or more windows."""

    @abstractmethod
    def assign_windows(
        self, element: Any, timestamp: int | None, context: WindowAssignerContext | None
    ) -> list[Any]:
        """The windows of ``element`` (its event time is ``timestamp``)."""

    @abstractmethod
    def get_default_trigger(self, *_: Any) -> Trigger:
        """The trigger used when the user sets none."""

    @abstractmethod
    def get_window_serializer(self) -> TypeSerializer[Any]:
        """The serializer of the windows (they are state namespaces)."""

    @abstractmethod
    def is_event_time(self) -> bool:
        """Whether windows are in event time (watermarks) or processing time."""

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if k[0] != "_")
        return f"{type(self).__name__}({params})"


class MergingWindowAssigner(WindowAssigner):
    """An assigner whose windows may merge (sessions)."""

    class MergeCallback(ABC):
        @abstractmethod
        def merge(self, to_be_merged: Iterable[Any], merge_result: Any) -> None: ...

    @abstractmethod
    def merge_windows(self, windows: Iterable[Any], callback: Any) -> None:
        """Call ``callback.merge(to_be_merged, merge_result)`` for each group that merges."""


def _event_timestamp(timestamp: int | None, who: str) -> int:
    if timestamp is None:
        raise ValueError(
            f"{who} assigns windows by event time but the record has no timestamp: give the "
            "runner a timestamp_assigner (and a watermark_delay), or use a processing-time "
            "assigner"
        )
    return timestamp


class WindowStagger(enum.Enum):
    """How the panes of tumbling windows are staggered across subtasks (Flink's
    ``WindowStagger``); the offset is chosen once per subtask, at its first element, from the
    processing time, and added to the assigner's offset. It is not checkpointed: a restored
    subtask chooses again."""

    #: no stagger: every subtask's windows start together
    ALIGNED = "aligned"
    #: a uniformly random offset in ``[0, size)``
    RANDOM = "random"
    #: the first element's lag in its un-offset window: ``now - window_start(now)``, so
    #: that the subtask's windows start at the processing time of its first element
    NATURAL = "natural"

    def get_stagger_offset(self, current_processing_time: int, size: int) -> int:
        if self is WindowStagger.RANDOM:
            return int(random.random() * size)
        if self is WindowStagger.NATURAL:
            start = TimeWindow.get_window_start_with_offset(current_processing_time, 0, size)
            return max(0, current_processing_time - start)
        return 0


class TumblingEventTimeWindows(WindowAssigner):
    """Fixed-size, non-overlapping event-time windows ``[k*size + offset, (k+1)*size + offset)``,
    optionally staggered per subtask (``window_stagger``, as Flink 2.3).

    The stagger offset is chosen from the *processing time* of the subtask's first element and
    added to ``offset``; windows stay in event time. It lives in this copy of the assigner (each
    subtask has its own), is not checkpointed, and is chosen again after a restore, a rescale or
    a restart of the subtask: new elements then go to windows aligned differently from the
    restored ones, which still fire at their own ends."""

    def __init__(
        self, size: int, offset: int = 0, window_stagger: WindowStagger = WindowStagger.ALIGNED
    ) -> None:
        if size <= 0 or abs(offset) >= size:
            raise ValueError(
                f"{type(self).__name__} needs 0 < size and |offset| < size, got size={size}, "
                f"offset={offset}"
            )
        if not isinstance(window_stagger, WindowStagger):
            raise TypeError(f"expected a WindowStagger, got {window_stagger!r}")
        self.size = size
        self.offset = offset
        self.window_stagger = window_stagger
        #: chosen at the first element this copy of the assigner (one subtask's) sees
        self.stagger_offset: int | None = None
        self._window_offset: int | None = None

    @classmethod
    def of(
        cls,
        size: int | timedelta,
        offset: int | timedelta = 0,
        window_stagger: WindowStagger = WindowStagger.ALIGNED,
    ) -> Self:
        return cls(_millis(size, "size"), _millis(offset, "offset"), window_stagger)

    def _timestamp(self, timestamp: int | None, context: Any) -> int:
        return _event_timestamp(timestamp, type(self).__name__)

    def _choose_stagger(self, context: Any) -> int:
        """The aligned offset ``(offset + stagger) % size``, choosing the stagger (once)."""
        if self.window_stagger is WindowStagger.ALIGNED:
            stagger = 0  # needs no clock (nor a context)
        else:
            now = int(context.get_current_processing_time())
            stagger = self.window_stagger.get_stagger_offset(now, self.size)
        self.stagger_offset = stagger
        self._window_offset = (self.offset + stagger) % self.size
        return self._window_offset

    def assign_windows(self, element: Any, timestamp: Any, context: Any) -> list[TimeWindow]:
        ts = self._timestamp(timestamp, context)
        offset = self._window_offset
        if offset is None:
            offset = self._choose_stagger(context)
        start = TimeWindow.get_window_start_with_offset(ts, offset, self.size)
        return [TimeWindow(start, start + self.size)]

    def get_default_trigger(self, *_: Any) -> Trigger:
        return EventTimeTrigger.create()

    def get_window_serializer(self) -> TypeSerializer[Any]:
        return TimeWindowSerializer()

    def is_event_time(self) -> bool:
        return True


class TumblingProcessingTimeWindows(TumblingEventTimeWindows):
    """Fixed-size, non-overlapping processing-time windows, optionally staggered per subtask
    (``window_stagger``)."""

    def _timestamp(self, timestamp: int | None, context: Any) -> int:
        return int(context.get_current_processing_time())

    def get_default_trigger(self, *_: Any) -> Trigger:
        return ProcessingTimeTrigger.create()

    def is_event_time(self) -> bool:
        return False


#: the most windows one element may be in, ``size // slide``, for sliding event-time windows
#: (Flink 2.3 refuses more; its processing-time windows do not check)
MAX_SLIDING_WINDOWS_PER_ELEMENT = 10_000_000


class SlidingEventTimeWindows(WindowAssigner):
    """Windows of ``size`` starting every ``slide``; an element is in ``ceil(size / slide)``."""

    def __init__(self, size: int, slide: int, offset: int = 0) -> None:
        if size <= 0 or slide <= 0 or abs(offset) >= slide:
            raise ValueError(
                f"{type(self).__name__} needs 0 < size, 0 < slide and |offset| < slide, got "
                f"size={size}, slide={slide}, offset={offset}"
            )
        if self.is_event_time() and size // slide > MAX_SLIDING_WINDOWS_PER_ELEMENT:
            raise ValueError(
                f"{type(self).__name__} needs size / slide <= {MAX_SLIDING_WINDOWS_PER_ELEMENT} "
                f"(windows per element), got size={size}, slide={slide}"
            )
        self.size = size
        self.slide = slide
        self.offset = offset

    @classmethod
    def of(
        cls, size: int | timedelta, slide: int | timedelta, offset: int | timedelta = 0
    ) -> SlidingEventTimeWindows:
        """Windows of ``size`` every ``slide`` (an element belongs to ``size / slide`` windows),
        shifted by ``offset``."""
        return cls(_millis(size, "size"), _millis(slide, "slide"), _millis(offset, "offset"))

    def _timestamp(self, timestamp: int | None, context: Any) -> int:
        return _event_timestamp(timestamp, type(self).__name__)

    def assign_windows(self, element: Any, timestamp: Any, context: Any) -> list[TimeWindow]:
        ts = self._timestamp(timestamp, context)
        size, slide = self.size, self.slide
        start = TimeWindow.get_window_start_with_offset(ts, self.offset % slide, slide)
        windows = []
        while start > ts - size:
            windows.append(TimeWindow(start, start + size))
            start -= slide
        return windows

    def get_default_trigger(self, *_: Any) -> Trigger:
        return EventTimeTrigger.create()

    def get_window_serializer(self) -> TypeSerializer[Any]:
        return TimeWindowSerializer()

    def is_event_time(self) -> bool:
        return True


class SlidingProcessingTimeWindows(SlidingEventTimeWindows):
    """Sliding windows in processing time."""

    def _timestamp(self, timestamp: int | None, context: Any) -> int:
        return int(context.get_current_processing_time())

    def get_default_trigger(self, *_: Any) -> Trigger:
        return ProcessingTimeTrigger.create()

    def is_event_time(self) -> bool:
        return False


class EventTimeSessionWindows(MergingWindowAssigner):
    """Sessions: each element opens ``[ts, ts + gap)``; overlapping windows of a key merge."""

    def __init__(self, gap: int) -> None:
        if gap <= 0:
            raise ValueError(f"{type(self).__name__} needs a gap > 0, got {gap}")
        self.gap = gap

    @classmethod
    def with_gap(cls, gap: int | timedelta) -> EventTimeSessionWindows:
        """Sessions that close after ``gap`` (ms or ``timedelta``) without an element."""
        return cls(_millis(gap, "gap"))

    @staticmethod
    def with_dynamic_gap(extractor: Any) -> EventTimeSessionWindows:
        """Sessions whose gap is ``extractor(element)`` (or ``extractor.extract(element)``)."""
        return DynamicEventTimeSessionWindows(extractor)

    def _timestamp(self, timestamp: int | None, context: Any) -> int:
        return _event_timestamp(timestamp, type(self).__name__)

    def _gap(self, element: Any) -> int:
        return self.gap

    def assign_windows(self, element: Any, timestamp: Any, context: Any) -> list[TimeWindow]:
        ts = self._timestamp(timestamp, context)
        gap = self._gap(element)
        if gap <= 0:
            raise ValueError(f"{type(self).__name__}: the session gap must be > 0, got {gap}")
        return [TimeWindow(ts, ts + gap)]

    def merge_windows(self, windows: Iterable[TimeWindow], callback: Any) -> None:
        merge_time_windows(windows, callback.merge)

    def get_default_trigger(self, *_: Any) -> Trigger:
        return EventTimeTrigger.create()

    def get_window_serializer(self) -> TypeSerializer[Any]:
        return TimeWindowSerializer()

    def is_event_time(self) -> bool:
        return True


class ProcessingTimeSessionWindows(EventTimeSessionWindows):
    """Sessions in processing time."""

    @staticmethod
    def with_dynamic_gap(extractor: Any) -> EventTimeSessionWindows:
        """Processing-time sessions whose gap ``extractor(element)`` chooses per element (ms)."""
        return DynamicProcessingTimeSessionWindows(extractor)

    def _timestamp(self, timestamp: int | None, context: Any) -> int:
        return int(context.get_current_processing_time())

    def get_default_trigger(self, *_: Any) -> Trigger:
        return ProcessingTimeTrigger.create()

    def is_event_time(self) -> bool:
        return False


def _extractor(extractor: Any) -> Callable[[Any], int]:
    fn = getattr(extractor, "extract", extractor)
    if not callable(fn):
        raise TypeError(f"a session gap extractor must be callable, got {extractor!r}")
    return fn  # type: ignore[no-any-return]


class DynamicEventTimeSessionWindows(EventTimeSessionWindows):
    """Event-time sessions with a gap computed per element."""

    def __init__(self, extractor: Any) -> None:
        self.gap = 0
        self.extractor = _extractor(extractor)

    def _gap(self, element: Any) -> int:
        return int(self.extractor(element))


class DynamicProcessingTimeSessionWindows(ProcessingTimeSessionWindows):
    """Processing-time sessions with a gap computed per element."""

    def __init__(self, extractor: Any) -> None:
        self.gap = 0
        self.extractor = _extractor(extractor)

    def _gap(self, element: Any) -> int:
        return int(self.extractor(element))


class GlobalWindows(WindowAssigner):
    """Every element of a key in one
    :class:`~streamstate.serializers.window_namespaces.GlobalWindow`.

    ``create()``'s default trigger never fires, so give a trigger (``CountTrigger.of(n)``,
    usually wrapped in ``PurgingTrigger``); ``create_with_end_of_stream_trigger()``'s fires once,
    when a bounded input ends (:class:`~streamstate.windows.triggers.EndOfStreamTrigger`)."""

    def __init__(self, end_of_stream: bool = False) -> None:
        #: whether the default trigger is the
        #: :class:`~streamstate.windows.triggers.EndOfStreamTrigger`
        self.end_of_stream = end_of_stream

    @classmethod
    def create(cls) -> GlobalWindows:
        """The assigner of one global window per key (give it a trigger)."""
        return cls()

    @classmethod
    def create_with_end_of_stream_trigger(cls) -> GlobalWindows:
        """Global windows that fire when the input ends: at the end of ``LocalRunner.run`` and
        of a Spark batch-mode job; never in a streaming query, whose input does not end."""
        return cls(end_of_stream=True)

    def assign_windows(self, element: Any, timestamp: Any, context: Any) -> list[GlobalWindow]:
        return [GlobalWindow()]

    def get_default_trigger(self, *_: Any) -> Trigger:
        return EndOfStreamTrigger() if self.end_of_stream else NeverTrigger()

    def get_window_serializer(self) -> TypeSerializer[Any]:
        return GlobalWindowSerializer()

    def is_event_time(self) -> bool:
        return False
