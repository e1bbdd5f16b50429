"""Windows (SPEC §9): assigners, triggers, window functions and the window operator.

Start with :func:`window`::

    window(TumblingEventTimeWindows.of(Time.hours(1))).aggregate(CountAgg(), MyWindowFunction())

returns a ``KeyedProcessFunction`` that the ``LocalRunner`` (and ``streamstate.spark``) run like
any keyed function.

Built-in aggregates over a column (``Count``, ``Sum``, ``Min``, ``Max``, ``Avg``; Spark SQL's
semantics) are here too: ``window(...).aggregate(Count(), MyWindowFunction())``; on Spark they
fold before the shuffle in Spark SQL's own partial aggregation (SPEC §13.2).
"""

from streamstate.api.aggregates import Avg, BuiltinAggregate, Count, Max, Min, Sum
from streamstate.serializers.window_namespaces import (
    GlobalWindow,
    GlobalWindowSerializer,
    TimeWindow,
    TimeWindowSerializer,
)
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
    WindowAssignerContext,
    WindowStagger,
)
from streamstate.windows.evicting_operator import EvictingWindowOperator
from streamstate.windows.evictors import (
    CountEvictor,
    DeltaEvictor,
    Evictor,
    EvictorContext,
    TimeEvictor,
    TimestampedValue,
)
from streamstate.windows.functions import ProcessWindowFunction, WindowFunction
from streamstate.windows.merging_window_set import MergingWindowSet
from streamstate.windows.operator import WindowOperator
from streamstate.windows.triggers import (
    ContinuousEventTimeTrigger,
    ContinuousProcessingTimeTrigger,
    CountTrigger,
    DeltaTrigger,
    EndOfStreamTrigger,
    EventTimeTrigger,
    NeverTrigger,
    OnMergeContext,
    ProcessingTimeTrigger,
    PurgingTrigger,
    Trigger,
    TriggerContext,
    TriggerResult,
)
from streamstate.windows.windowed_stream import WindowedStream, window

__all__ = [
    "Avg",
    "BuiltinAggregate",
    "ContinuousEventTimeTrigger",
    "ContinuousProcessingTimeTrigger",
    "Count",
    "CountEvictor",
    "CountTrigger",
    "DeltaEvictor",
    "DeltaTrigger",
    "DynamicEventTimeSessionWindows",
    "DynamicProcessingTimeSessionWindows",
    "EndOfStreamTrigger",
    "EventTimeSessionWindows",
    "EventTimeTrigger",
    "EvictingWindowOperator",
    "Evictor",
    "EvictorContext",
    "GlobalWindow",
    "GlobalWindowSerializer",
    "GlobalWindows",
    "Max",
    "MergingWindowAssigner",
    "MergingWindowSet",
    "Min",
    "NeverTrigger",
    "OnMergeContext",
    "ProcessWindowFunction",
    "ProcessingTimeSessionWindows",
    "ProcessingTimeTrigger",
    "PurgingTrigger",
    "SlidingEventTimeWindows",
    "SlidingProcessingTimeWindows",
    "Sum",
    "TimeEvictor",
    "TimeWindow",
    "TimeWindowSerializer",
    "TimestampedValue",
    "Trigger",
    "TriggerContext",
    "TriggerResult",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "WindowAssigner",
    "WindowAssignerContext",
    "WindowFunction",
    "WindowOperator",
    "WindowStagger",
    "WindowedStream",
    "window",
]
