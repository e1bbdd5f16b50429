"""Windows (SPEC §9): assigners, triggers, window functions and the window operator.

Start with :func:`window`::

    window(TumblingEventTimeWindows.of(Time.hours(1))).aggregate(CountAgg(), MyWindowFunction())

returns a ``KeyedProcessFunction`` that the ``LocalRunner`` (and ``streamstate.spark``) run like
any keyed function.
"""

from streamstate.windows.assigners import (
    DynamicEventTimeSessionWindows,
    DynamicProcessingTimeSessionWindows,
    EventTimeSessionWindows,
    GlobalWindows,
    MergingWindowAssigner,
    ProcessingTimeSessionWindows,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowAssigner,
)
from streamstate.windows.functions import ProcessWindowFunction, WindowFunction
from streamstate.windows.merging_window_set import MergingWindowSet
from streamstate.windows.operator import WindowOperator
from streamstate.windows.time_window import (
    GlobalWindow,
    GlobalWindowSerializer,
    TimeWindow,
    TimeWindowSerializer,
)
from streamstate.windows.triggers import (
    CountTrigger,
    EventTimeTrigger,
    NeverTrigger,
    ProcessingTimeTrigger,
    PurgingTrigger,
    Trigger,
    TriggerResult,
)
from streamstate.windows.windowed_stream import WindowedStream, window

__all__ = [
    "CountTrigger",
    "DynamicEventTimeSessionWindows",
    "DynamicProcessingTimeSessionWindows",
    "EventTimeSessionWindows",
    "EventTimeTrigger",
    "GlobalWindow",
    "GlobalWindowSerializer",
    "GlobalWindows",
    "MergingWindowAssigner",
    "MergingWindowSet",
    "NeverTrigger",
    "ProcessWindowFunction",
    "ProcessingTimeSessionWindows",
    "ProcessingTimeTrigger",
    "PurgingTrigger",
    "SlidingEventTimeWindows",
    "SlidingProcessingTimeWindows",
    "TimeWindow",
    "TimeWindowSerializer",
    "Trigger",
    "TriggerResult",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "WindowAssigner",
    "WindowFunction",
    "WindowOperator",
    "WindowedStream",
    "window",
]
