"""The window API: ``window(assigner)...reduce/aggregate/process/apply`` (SPEC §9).

The builder mirrors PyFlink's ``WindowedStream`` and returns a
:class:`~streamstate.windows.operator.WindowOperator`, a
``KeyedProcessFunction`` that any keyed runner runs:

>>> from streamstate import LocalRunner, Time
>>> from streamstate.windows import TumblingEventTimeWindows, window
>>> fn = window(TumblingEventTimeWindows.of(Time.seconds(10))).reduce(lambda a, b: a + b)
>>> runner = LocalRunner(fn, key_selector=lambda r: "k", timestamp_assigner=lambda r: r * 1000,
...                      watermark_delay=0)
>>> runner.run([1, 2, 12, 3, 15])  # 3 is late: window [0, 10s) fired when 12 s arrived
[3, 27]
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from streamstate.api.functions import AggregateFunction, OutputTag, ReduceFunction
from streamstate.windows.assigners import WindowAssigner
from streamstate.windows.contents import WindowContents
from streamstate.windows.evicting_operator import EvictingWindowOperator
from streamstate.windows.evictors import Evictor
from streamstate.windows.functions import internal_window_function
from streamstate.windows.operator import WindowOperator
from streamstate.windows.triggers import Trigger

__all__ = ["WindowedStream", "window"]


def window(assigner: WindowAssigner) -> WindowedStream:
    """Start a window specification with ``assigner`` (records are keyed by the runner)."""
    return WindowedStream(assigner)


class WindowedStream:
    """A window specification; finish it with ``reduce``, ``aggregate``, ``process`` or
    ``apply``, which return the
    :class:`~streamstate.windows.operator.WindowOperator` to run."""

    def __init__(self, assigner: WindowAssigner) -> None:
        if not isinstance(assigner, WindowAssigner):
            raise TypeError(f"expected a WindowAssigner, got {assigner!r}")
        self._assigner = assigner
        self._trigger: Trigger | None = None
        self._allowed_lateness = 0
        self._late_tag: OutputTag | None = None
        self._evictor: Evictor | None = None

    def trigger(self, trigger: Trigger) -> WindowedStream:
        """Replace the assigner's default trigger."""
        if not isinstance(trigger, Trigger):
            raise TypeError(f"expected a Trigger, got {trigger!r}")
        self._trigger = trigger
        return self

    def evictor(self, evictor: Evictor) -> WindowedStream:
        """Evict elements before and/or after the window function runs. As in Flink, the
        windows then keep every element (list state), also for ``reduce`` and ``aggregate``,
        which run over the remaining elements when a window fires."""
        if not isinstance(evictor, Evictor):
            raise TypeError(f"expected an Evictor, got {evictor!r}")
        self._evictor = evictor
        return self

    def allowed_lateness(self, time_ms: int | timedelta) -> WindowedStream:
        """Keep event-time windows this long after their end: late elements within it update
        the window and fire it again; later ones are late data."""
        ms = int(time_ms.total_seconds() * 1000) if isinstance(time_ms, timedelta) else time_ms
        if ms < 0:
            raise ValueError(f"allowed lateness must be >= 0, got {ms}")
        self._allowed_lateness = int(ms)
        return self

    def side_output_late_data(self, output_tag: OutputTag) -> WindowedStream:
        """Send late elements to ``output_tag`` instead of dropping them."""
        if not isinstance(output_tag, OutputTag):
            raise TypeError(f"expected an OutputTag, got {output_tag!r}")
        self._late_tag = output_tag
        return self

    def _build(self, contents: WindowContents, function: Any) -> WindowOperator:
        args = (
            self._assigner,
            self._trigger or self._assigner.get_default_trigger(),
            contents,
            internal_window_function(function, contents.single),
            self._allowed_lateness,
            self._late_tag,
        )
        if self._evictor is not None:
            return EvictingWindowOperator(*args, evictor=self._evictor)
        return WindowOperator(*args)

    def reduce(
        self, reduce_function: Any, window_function: Any = None, element_type: Any = None
    ) -> WindowOperator:
        """Fold the elements of each window incrementally with ``reduce_function`` (a
        ``ReduceFunction`` or a two-argument callable); emit the result, or pass it to
        ``window_function`` (a ProcessWindowFunction or WindowFunction)."""
        if not isinstance(reduce_function, ReduceFunction):
            if not callable(reduce_function):
                raise TypeError(f"expected a ReduceFunction or callable, got {reduce_function!r}")
            reduce_function = ReduceFunction.of(reduce_function)
        return self._build(
            WindowContents("reducing", reduce_function, element_type), window_function
        )

    def aggregate(
        self,
        aggregate_function: AggregateFunction[Any, Any, Any],
        window_function: Any = None,
        accumulator_type: Any = None,
    ) -> WindowOperator:
        """Aggregate each window incrementally; emit ``get_result`` of the accumulator, or pass
        it to ``window_function``. The accumulator type is inferred from
        ``create_accumulator()`` unless given."""
        if not isinstance(aggregate_function, AggregateFunction):
            raise TypeError(f"expected an AggregateFunction, got {aggregate_function!r}")
        return self._build(
            WindowContents("aggregating", aggregate_function, accumulator_type), window_function
        )

    def process(self, process_window_function: Any, element_type: Any = None) -> WindowOperator:
        """Keep every element of each window and hand them to ``process_window_function``.
        The element type is inferred from the first element unless given."""
        if process_window_function is None:
            raise TypeError("process() needs a ProcessWindowFunction")
        return self._build(WindowContents("list", None, element_type), process_window_function)

    def apply(self, window_function: Any, element_type: Any = None) -> WindowOperator:
        """Like :meth:`process`, with a ``WindowFunction`` (``apply(key, window, inputs)``)."""
        if window_function is None:
            raise TypeError("apply() needs a WindowFunction")
        return self._build(WindowContents("list", None, element_type), window_function)
