"""No-data micro-batches: when a streaming query runs a micro-batch without input (SPEC §13.1).

Spark runs a micro-batch without new data when a stateful operator's watermark or timers call
for it (``spark.sql.streaming.noDataMicroBatches.enabled``, on by default). A streamstate query
has no stateful operator in Spark's plan, so Spark calls ``foreachBatch`` only with new input;
the driver runs the no-data micro-batches itself, from what each committed checkpoint records
(:class:`TimeProgress`):

* **event time** is due when the watermark the next micro-batch would use,
  ``max(watermark, max_timestamp - delay - 1)`` (:func:`next_watermark`), is above the watermark
  the checkpoint applied and reaches the earliest pending event-time timer of any subtask (a
  timer fires once the watermark is >= its timestamp, as in Flink; a watermark that does not
  move fires nothing, as in Spark, whose no-data batch needs a newer watermark);
* **processing time** is due when the earliest pending processing-time timer of any subtask is
  at or before the driver's clock.

Each subtask reports its earliest timers (every timer service: windows' too) in its
acknowledgement, and the driver commits the minimum over the subtasks with the checkpoint, so
what is pending is known from storage alone, after a restart or a rollback as well.

Where they run:

* inside the ``foreachBatch`` call of Spark micro-batch ``b``, after ``b``'s own step, while
  one is due (processing time only without an :class:`IdleTicker`, i.e. under ``availableNow``
  or ``once``: a running query's next data batch fires due processing-time timers at its
  start, and the ticker does when no data comes); at most :data:`MAX_NO_DATA_BATCHES` in a row;
* before ``b``'s own step when the checkpoint it starts from already owes an event-time one
  (after a rollback, or when the bound stopped an earlier call): so that every checkpoint id
  holds the same step as in the first run;
* from the :class:`IdleTicker` of a running query (a ``processingTime`` or the default trigger)
  when no data arrives: at most one per trigger interval.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

from streamstate.timers import MIN_WATERMARK

__all__ = [
    "DUE_EVENT_TIME",
    "DUE_PROCESSING_TIME",
    "MAX_NO_DATA_BATCHES",
    "MIN_IDLE_INTERVAL",
    "IdleTicker",
    "TimeProgress",
    "due",
    "next_watermark",
    "trigger_interval",
]

log = logging.getLogger(__name__)

#: no-data micro-batches run in a row by one ``foreachBatch`` call (or one look of the idle
#: ticker) at most: a function whose timer re-registers itself as already due would otherwise
#: keep the call going forever; the rest is left to the next call or tick
MAX_NO_DATA_BATCHES = 10
#: the idle ticker runs no-data micro-batches at least this many seconds apart (the default
#: trigger's interval is 0: "as fast as possible")
MIN_IDLE_INTERVAL = 0.1
#: what made a no-data micro-batch due (``query.batches[i]["due"]``)
DUE_EVENT_TIME = "event time"
DUE_PROCESSING_TIME = "processing time"


@dataclasses.dataclass(frozen=True)
class TimeProgress:
    """What a committed checkpoint says about time (its metadata's properties)."""

    #: the watermark the checkpoint's micro-batch applied
    watermark: int = MIN_WATERMARK
    #: the largest event time seen up to it
    max_timestamp: int = MIN_WATERMARK
    #: the earliest pending event-time / processing-time timer over every subtask (None: none,
    #: or a checkpoint written before they were recorded)
    event_timer: int | None = None
    processing_timer: int | None = None

    @classmethod
    def of(cls, properties: Mapping[str, Any]) -> TimeProgress:
        """From a checkpoint's ``properties`` (older checkpoints lack the timers: none due).

        >>> TimeProgress.of({"watermark": 5, "max_timestamp": 9, "event_timer": 7})
        TimeProgress(watermark=5, max_timestamp=9, event_timer=7, processing_timer=None)
        """

        def maybe(name: str) -> int | None:
            value = properties.get(name)
            return None if value is None else int(value)

        return cls(
            int(properties.get("watermark", MIN_WATERMARK)),
            int(properties.get("max_timestamp", MIN_WATERMARK)),
            maybe("event_timer"),
            maybe("processing_timer"),
        )


def next_watermark(watermark: int, max_timestamp: int, delay: int | None) -> int:
    """The watermark of the micro-batch after one that applied ``watermark`` and saw event times
    up to ``max_timestamp`` (bounded out-of-orderness ``delay`` ms; None: no watermark from the
    data).

    >>> next_watermark(100, 5_000, 1_000)
    3999
    >>> next_watermark(4_500, 5_000, 1_000)   # never goes back
    4500
    >>> next_watermark(100, 5_000, None)
    100
    """
    if delay is None or max_timestamp == MIN_WATERMARK:
        return watermark
    return max(watermark, max_timestamp - delay - 1)


def due(
    progress: TimeProgress, delay: int | None, now: int, *, processing_time: bool = True
) -> str | None:
    """Why a no-data micro-batch after ``progress`` is due at ``now`` (ms): ``"event time"``,
    ``"processing time"``, or None (not due). ``processing_time=False`` asks about event time
    only.

    >>> p = TimeProgress(watermark=999, max_timestamp=3_500, event_timer=1_999)
    >>> due(p, 1_000, now=0)                     # the next watermark 2499 passes the timer
    'event time'
    >>> due(p, 2_000, now=0) is None             # 1499: not yet
    True
    >>> due(TimeProgress(watermark=2_499, max_timestamp=3_500, event_timer=1_999), 1_000, now=0)
    >>> due(TimeProgress(processing_timer=50), None, now=50)
    'processing time'
    >>> due(TimeProgress(processing_timer=50), None, now=50, processing_time=False) is None
    True
    """
    if progress.event_timer is not None:
        upcoming = next_watermark(progress.watermark, progress.max_timestamp, delay)
        if upcoming > progress.watermark and upcoming >= progress.event_timer:
            return DUE_EVENT_TIME
    timer = progress.processing_timer
    if processing_time and timer is not None and timer <= now:
        return DUE_PROCESSING_TIME
    return None


_UNITS_S = {
    "microsecond": 1e-6,
    "us": 1e-6,
    "millisecond": 1e-3,
    "ms": 1e-3,
    "second": 1.0,
    "sec": 1.0,
    "s": 1.0,
    "minute": 60.0,
    "min": 60.0,
    "m": 60.0,
    "hour": 3600.0,
    "h": 3600.0,
    "day": 86400.0,
    "d": 86400.0,
    "week": 7 * 86400.0,
}


def trigger_interval(trigger: Mapping[str, Any] | None) -> float | None:
    """The seconds between micro-batches of a query started with ``trigger`` (the keywords of
    ``DataStreamWriter.trigger``), or None for a run that ends by itself (``availableNow``,
    ``once``) or a trigger without micro-batches.

    >>> trigger_interval(None), trigger_interval({"processingTime": "10 seconds"})
    (0.0, 10.0)
    >>> trigger_interval({"processingTime": "interval 1 minute 30 seconds"})
    90.0
    >>> trigger_interval({"availableNow": True}) is None
    True
    """
    if not trigger:
        return 0.0
    if trigger.get("availableNow") or trigger.get("once"):
        return None
    spec = trigger.get("processingTime")
    if spec is None:
        return None  # continuous processing: no micro-batches
    text = str(spec).strip().lower()
    if text.startswith("interval"):
        text = text[len("interval") :]
    parts = re.findall(r"(-?\d+(?:\.\d+)?)\s*([a-z]+)", text)
    total = 0.0
    for number, unit in parts:
        scale = _UNITS_S.get(unit, _UNITS_S.get(unit.removesuffix("s")))
        if scale is None:
            break
        total += float(number) * scale
    else:
        if parts:
            return total
    log.warning(
        "cannot read the trigger interval %r: the idle ticker looks for due processing-time "
        "timers every second",
        spec,
    )
    return 1.0


class IdleTicker:
    """A daemon thread that runs a running query's no-data micro-batches while no input comes.

    ``tick()`` looks at the query (under the query's step lock, see
    :meth:`~streamstate.spark.driver.step.micro_batches.MicroBatchRunner._idle_tick`), runs a
    no-data micro-batch if one is due, and returns the seconds to wait before the next look, or None
    when the ticker should end (the query stopped or failed). :meth:`wake` makes it look at
    once (a new checkpoint may bring a nearer timer); :meth:`stop` ends it between looks.
    """

    def __init__(self, tick: Callable[[], float | None], name: str) -> None:
        self._tick = tick
        self._stopped = False
        self._nudge = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        """Start the thread; its first look is at once."""
        self._thread.start()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def wake(self) -> None:
        """Look at the query now instead of at the end of the current wait."""
        self._nudge.set()

    def _run(self) -> None:
        while not self._stopped:
            try:
                wait = self._tick()
            except Exception:  # the query records its own failures; never die silently
                log.exception("the idle ticker of a streaming query failed")
                return
            if wait is None:
                return
            self._nudge.wait(max(0.0, wait))
            self._nudge.clear()

    def stop(self, timeout: float | None = 120.0) -> None:
        """End the ticker; wait (up to ``timeout`` s) for a no-data micro-batch it runs."""
        self._stopped = True
        self._nudge.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
