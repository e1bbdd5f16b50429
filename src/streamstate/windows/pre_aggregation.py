"""Pre-aggregation of window aggregates (SPEC §13.2): when a window's elements may be folded
per (key, window) before they reach their subtask, and what the subtask then receives.

Flink SQL's local-global aggregation and Spark's partial aggregation fold each group where the
data is, then ship one accumulator per group. A window operator can do the same when nothing in
it looks at single elements once they are added: its assigner does not merge windows, its
contents are an ``aggregate`` or ``reduce`` (no evictor, no ``process``/``apply`` list), and its
trigger decides from the window, the clocks and at most the window's first timestamp (and an
event-time assigner is not staggered: the stagger is chosen by each subtask). Then, for
one micro-batch,

* the windows of every element come from its timestamp alone (:class:`EventTimeWindowing`, for
  whole columns), and whether a window is late from the batch's watermark, which the driver
  fixes when it plans the batch and which stays constant while the subtask processes it;
* an element all of whose windows are late is late data (dropped and counted, or sent to the
  late side output) exactly as the per-record path decides it; the fold decides it, or leaves
  it to the subtask (whose watermark is the same): a window is late for all of its elements,
  and an element is late exactly when its latest window is, so a late group's elements whose
  latest window it is are the late ones;
* each (key, window) group is folded with ``add`` (or the reduce function) and merged into the
  window's state with ``merge`` (or the reduce function): a :class:`Partial`, handed to
  :meth:`~streamstate.windows.operator.WindowOperator.process_partial`, which then runs the
  trigger and registers the cleanup timer as the per-record path does for an element.

``merge`` must combine two accumulators as if their elements had been added to one, in any
order (Flink's contract for ``AggregateFunction.merge``; for ``reduce``: an associative and
commutative function).

Which outputs are then *identical* to the per-record path (:func:`pre_aggregation_of`): the
trigger sees elements only to register timers that depend on the window (``EventTimeTrigger``,
``ProcessingTimeTrigger``, ``ContinuousProcessingTimeTrigger``, ``EndOfStreamTrigger``,
``NeverTrigger``, and ``PurgingTrigger`` of them), and no element can make the window fire: with
event-time windows and no allowed lateness, every element that is not dropped belongs to a
window the watermark has not reached. With allowed lateness (or an event-time trigger on
processing-time windows) an element can arrive after its window fired: per record the window
fires again for each such element, pre-aggregated once per window per micro-batch with all of
them (Flink SQL's mini-batch semantics), so the last firing is the same but earlier ones are
missing (with a ``PurgingTrigger``, each firing holds the micro-batch's late elements of the
window together). ``ContinuousEventTimeTrigger`` aligns its first fire time on the window's
first element; a pre-aggregated group gives its earliest timestamp instead, so intermediate
firings can differ.
These are opt-in (``pre_aggregate=True``).

Session windows are refused: whether an element of a session is late depends on the sessions
its key already holds on the subtask and on the order of arrival (an element whose own window is
late is kept if it merges into a live session first), which a fold before the shuffle cannot
know.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from streamstate.errors import PreAggregationError
from streamstate.windows.assigners import (
    GlobalWindows,
    MergingWindowAssigner,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowStagger,
)
from streamstate.windows.evicting_operator import EvictingWindowOperator
from streamstate.windows.operator import WindowOperator
from streamstate.windows.partial import LATE, PARTIAL, WINDOWLESS, Partial
from streamstate.windows.triggers import (
    ContinuousEventTimeTrigger,
    ContinuousProcessingTimeTrigger,
    EndOfStreamTrigger,
    EventTimeTrigger,
    NeverTrigger,
    ProcessingTimeTrigger,
    PurgingTrigger,
    Trigger,
)

__all__ = [
    "LATE",
    "PARTIAL",
    "WINDOWLESS",
    "EventTimeWindowing",
    "Partial",
    "PreAggregation",
    "choose_pre_aggregation",
    "pre_aggregation_of",
]

_MIN = -(1 << 63)


@dataclasses.dataclass(frozen=True)
class PreAggregation:
    """How a window operator is pre-aggregated (see the module docstring)."""

    #: outputs identical to the per-record path (pre-aggregation is on by default)
    exact: bool
    #: what can differ from the per-record path when not ``exact`` (empty when exact)
    differs: str
    #: the windowing of event-time windows (assigned before the shuffle); None: the subtask
    #: assigns the windows itself (processing-time and global windows: every element of a
    #: micro-batch has the same windows there)
    windowing: EventTimeWindowing | None
    #: late elements go to a side output (else they are dropped and counted)
    late_output: bool
    #: "aggregating" or "reducing"
    contents: str


@dataclasses.dataclass(frozen=True)
class EventTimeWindowing:
    """Event-time windows of ``size`` starting every ``slide`` (tumbling: ``slide == size``),
    aligned on ``offset`` (``0 <= offset < slide``), kept ``allowed_lateness`` after their end.

    :meth:`assign` computes, for whole columns of timestamps, what the window operator computes
    per element: Flink's window start with offset (``ts - floorMod(ts - offset, slide)``, so
    negative timestamps too), and lateness against the watermark.

    >>> w = EventTimeWindowing(10, 5, 0, 0)
    >>> a = w.assign(np.array([23, -3]), None)
    >>> a.elements.tolist(), a.starts.tolist()
    ([0, 0, 1, 1], [20, 15, -5, -10])
    """

    size: int
    slide: int
    offset: int
    allowed_lateness: int

    def windows_per_element(self) -> int:
        return -(-self.size // self.slide)

    def late_threshold(self, watermark: int | None) -> int | None:
        """A window whose last millisecond is at or before this is late; None: nothing is late
        (no watermark yet)."""
        if watermark is None or watermark <= _MIN:
            return None
        threshold = watermark - self.allowed_lateness
        return None if threshold < _MIN else threshold

    def assign(self, timestamps: np.ndarray, watermark: int | None) -> WindowAssignment:
        """The windows of the elements with these ``timestamps`` (int64 ms) that are not late
        under ``watermark``, as parallel arrays (element index, window start; the windows of an
        element latest first, as the assigners list them), and the elements that are late or
        belong to no window."""
        ts = np.asarray(timestamps, dtype=np.int64)
        size, slide = self.size, self.slide
        last = ts - np.mod(ts - self.offset, slide)
        threshold = self.late_threshold(watermark)
        n = len(ts)
        has_window = np.zeros(n, dtype=bool)
        elements: list[np.ndarray] = []
        starts: list[np.ndarray] = []
        lowest = ts - size  # a window starting at or before this does not contain ts
        for i in range(self.windows_per_element()):
            start = last - i * slide
            ok = start > lowest
            if threshold is not None:
                ok &= start + (size - 1) > threshold
            idx = np.flatnonzero(ok)
            elements.append(idx)
            starts.append(start[idx])
            has_window |= ok
        if len(elements) == 1:
            element_index, window_start = elements[0], starts[0]
        else:
            # element-major, windows latest first: the per-record order
            element_index = np.concatenate(elements)
            window_start = np.concatenate(starts)
            order = np.argsort(element_index, kind="stable")
            element_index, window_start = element_index[order], window_start[order]
        late = np.zeros(n, dtype=bool) if threshold is None else ~has_window & (ts <= threshold)
        return WindowAssignment(
            element_index, window_start, np.flatnonzero(late), np.flatnonzero(~has_window & ~late)
        )


@dataclasses.dataclass(frozen=True)
class WindowAssignment:
    """What :meth:`EventTimeWindowing.assign` found (arrays of element indices)."""

    #: one entry per (element, window that is not late)
    elements: np.ndarray
    starts: np.ndarray
    #: elements every window of which is late: late data
    late: np.ndarray
    #: elements in no window (and not late): they only count as records
    windowless: np.ndarray


def _trigger_parts(trigger: Trigger) -> tuple[bool, bool]:
    """(fires on an element whose window the watermark passed, aligns on the first element's
    timestamp) of a trigger pre-aggregation can run; PreAggregationError for the others."""
    if isinstance(trigger, PurgingTrigger):
        return _trigger_parts(trigger.nested)
    kind = type(trigger)
    if kind is EventTimeTrigger:
        return True, False
    if kind is ContinuousEventTimeTrigger:
        return True, True
    if kind in (
        ProcessingTimeTrigger,
        ContinuousProcessingTimeTrigger,
        NeverTrigger,
        EndOfStreamTrigger,
    ):
        return False, False
    raise PreAggregationError(
        f"the trigger {trigger!r} may look at each element (count and delta triggers do, and "
        "streamstate cannot tell for another trigger); only the event-time, continuous "
        "event-time, processing-time, continuous processing-time, end-of-stream and never "
        "triggers (or a "
        "PurgingTrigger of them) can be pre-aggregated"
    )


def pre_aggregation_of(function: Any, *, bounded: bool = False) -> PreAggregation:
    """How ``function`` is pre-aggregated, or PreAggregationError saying why it cannot be.

    ``bounded``: batch mode (the watermark stays at its minimum until the input ends, so no
    element arrives behind it).
    """
    if not isinstance(function, WindowOperator):
        raise PreAggregationError(
            f"{type(function).__name__} is not a window aggregate: a KeyedProcessFunction "
            "sees every record; pre-aggregation applies to window(...).aggregate(...) and "
            ".reduce(...)"
        )
    if isinstance(function, EvictingWindowOperator):
        raise PreAggregationError(
            "an evictor looks at every element of a window when it fires: the window keeps "
            "them all, so there is nothing to fold before the shuffle"
        )
    contents = function.contents.kind
    if contents not in ("aggregating", "reducing"):
        raise PreAggregationError(
            "process() and apply() keep every element of a window (a ProcessWindowFunction "
            "without an aggregate): there is nothing to fold before the shuffle; give "
            "aggregate(fn, window_function) or reduce(fn, window_function)"
        )
    op: WindowOperator = function
    assigner = op.assigner
    if isinstance(assigner, MergingWindowAssigner):
        raise PreAggregationError(
            f"{type(assigner).__name__} merges windows: whether a session's element is late "
            "depends on the sessions its key already holds on the subtask and on the order of "
            "arrival (an element whose own window is late is kept if it first merges into a "
            "live session), which a fold before the shuffle cannot know"
        )
    windowing: EventTimeWindowing | None
    event_time_windows = assigner.is_event_time()
    subtask_windows = (TumblingProcessingTimeWindows, SlidingProcessingTimeWindows, GlobalWindows)
    if isinstance(assigner, subtask_windows):
        windowing = None
    elif isinstance(assigner, (TumblingEventTimeWindows, SlidingEventTimeWindows)):
        if (
            isinstance(assigner, TumblingEventTimeWindows)
            and assigner.window_stagger is not WindowStagger.ALIGNED
        ):
            raise PreAggregationError(
                f"{assigner!r} is staggered: each subtask chooses its windows' offset from the "
                "processing time of its first element, which a fold before the shuffle cannot "
                "know"
            )
        slide = assigner.slide if isinstance(assigner, SlidingEventTimeWindows) else assigner.size
        windowing = EventTimeWindowing(
            assigner.size, slide, assigner.offset % slide, op.allowed_lateness
        )
    else:
        raise PreAggregationError(
            f"the window assigner {assigner!r} is not one of streamstate's tumbling, sliding "
            "or global assigners: its windows cannot be computed before the shuffle"
        )
    fires_late, first_timestamp = _trigger_parts(op.trigger)
    differs = []
    if fires_late and not bounded:
        if not event_time_windows:
            differs.append(
                "an event-time trigger on processing-time windows fires the window again for "
                "every element that arrives after the watermark passed it; pre-aggregated, once "
                "per window per micro-batch"
            )
        elif op.allowed_lateness > 0:
            differs.append(
                f"with allowed lateness ({op.allowed_lateness} ms) the window fires again for "
                "every late element; pre-aggregated, once per window per micro-batch with all "
                "of them"
            )
    if first_timestamp:
        differs.append(
            "ContinuousEventTimeTrigger aligns its first fire time on the window's first "
            "element; pre-aggregated, on the earliest timestamp of the window's first group"
        )
    return PreAggregation(
        exact=not differs,
        differs="; ".join(differs),
        windowing=windowing,
        late_output=op.late_data_output_tag is not None,
        contents=contents,
    )


def choose_pre_aggregation(
    function: Any, requested: bool | None, *, bounded: bool = False
) -> PreAggregation | None:
    """The pre-aggregation to run for ``function``: ``requested`` False never, None (the
    default) only where the outputs are those of the per-record path, True wherever it can run
    (PreAggregationError naming the reason where it cannot)."""
    if requested is False:
        return None
    try:
        found = pre_aggregation_of(function, bounded=bounded)
    except PreAggregationError:
        if requested:
            raise
        return None
    if requested is None and not found.exact:
        return None
    return found
