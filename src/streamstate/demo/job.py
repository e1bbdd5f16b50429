"""The main job: page views per app per hour (the seeds' example).

A stream of page-view events ``(app, timestamp_ms)`` is keyed by app; each app keeps one counter
per hour of event time, with the hour's window as the state's namespace; when the watermark
passes the end of an hour, ``(app, hour, views)`` is emitted and that hour's state and timers
are cleared.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from streamstate.api.functions import AggregateFunction
from streamstate.windows import Count, ProcessWindowFunction, TumblingEventTimeWindows, window

__all__ = [
    "HOUR_MS",
    "CountViews",
    "EmitHour",
    "generate_events",
    "page_view_batch",
    "page_views_per_hour",
]

HOUR_MS = 3_600_000


def generate_events(
    n: int, apps: int = 5, hours: int = 6, seed: int = 7, disorder_ms: int = 60_000
) -> Iterator[tuple[str, int]]:
    """``n`` page views over ``hours`` hours, roughly in time order (bounded disorder)."""
    rnd = random.Random(seed)
    span = hours * HOUR_MS
    for i in range(n):
        ts = i * span // n + rnd.randrange(-disorder_ms, disorder_ms + 1)
        yield (f"app-{rnd.randrange(apps)}", max(0, ts))


def page_view_batch(
    index: int,
    n: int,
    *,
    start_ms: int,
    span_ms: int,
    apps: int = 5,
    seed: int = 7,
    disorder_ms: int = 60_000,
) -> list[tuple[str, int]]:
    """Slice ``index`` of an endless page-view stream: ``n`` views spread over
    ``[start_ms + index * span_ms, start_ms + (index + 1) * span_ms)``, each moved by up to
    ``disorder_ms`` either way (never before ``start_ms``). Slices depend only on their
    arguments, so a stream can be continued later, slice by slice. App ``i`` gets a share of
    views growing with ``i``.

    >>> page_view_batch(3, 2, start_ms=0, span_ms=1000, disorder_ms=0)
    [('app-4', 3000), ('app-4', 3500)]
    """
    rnd = random.Random(seed * 1_000_003 + index)
    weights = list(range(1, apps + 1))
    names = [f"app-{i}" for i in range(apps)]
    base = start_ms + index * span_ms
    chosen = rnd.choices(names, weights, k=n)
    return [
        (app, max(start_ms, base + i * span_ms // n + rnd.randint(-disorder_ms, disorder_ms)))
        for i, app in enumerate(chosen)
    ]


class CountViews(AggregateFunction):
    """Counts the views of one app in one hour: the built-in ``Count()`` as a Python
    ``AggregateFunction`` (the benchmarks compare the two)."""

    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, accumulator: int) -> int:
        return accumulator + 1

    def get_result(self, accumulator: int) -> int:
        return accumulator

    def merge(self, acc_a: int, acc_b: int) -> int:
        return acc_a + acc_b


class EmitHour(ProcessWindowFunction):
    """Emits ``(app, hour number, views)`` when an hour's window fires."""

    def process(self, key: str, context: Any, counts: Any) -> Iterator[tuple[str, int, int]]:
        yield key, context.window().start // HOUR_MS, counts[0]


def page_views_per_hour() -> Any:
    """The keyed function of the job: hourly tumbling event-time windows per app.

    Each window (the hour) is the namespace of the app's counter state; when the watermark
    passes the end of the hour the window fires and its state and timers are removed. The
    counter is the built-in ``Count()``: on Spark, the views of each app and hour are counted
    before the shuffle by Spark SQL's own partial aggregation (SPEC §13.2).
    """
    return window(TumblingEventTimeWindows.of(HOUR_MS)).aggregate(Count(), EmitHour())
